"""What `check` looks at: the artifact's facts, read once from disk (thin), and the finding types.

No tensor data is read except each quantized Linear's 2-element `weight_shape`; no torch.
"""

from __future__ import annotations

import json
import logging
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qwenquant.checkpoint.config import text_config
from qwenquant.checkpoint.header import (
    INDEX_NAME,
    SafetensorsError,
    SafetensorsHeader,
    check_index,
    load_index_json,
    read_header,
)
from qwenquant.checkpoint.tensorfile import TensorRef, header_refs
from qwenquant.errors import CheckError, UsageError
from qwenquant.recipe import target_matches, targets_cover

log = logging.getLogger(__name__)

PACKED_SUFFIXES = ("weight_packed", "weight_scale", "weight_shape", "weight_zero_point", "weight_g_idx")
TEXT_ONLY_ARCH = "Qwen3_5ForCausalLM"
MULTIMODAL_ARCH = "Qwen3_5ForConditionalGeneration"
IGNORED = "(ignored)"
FLOAT_DTYPES = ("BF16", "F16", "F32")  # a bf16 (unquantized) tensor may be stored in any of these


@dataclass(frozen=True)
class Finding:
    """One reason vLLM would refuse (or mis-load) the artifact."""

    rule: str
    where: str  # tensor, module, file or config key
    message: str
    fix: str

    def __str__(self) -> str:
        return f"{self.rule}: {self.where}: {self.message} — {self.fix}"


@dataclass(frozen=True)
class CheckReport:
    artifact_dir: str
    layout: str | None
    tensors_checked: int
    rules_run: tuple[str, ...]
    findings: tuple[Finding, ...]

    @property
    def ok(self) -> bool:
        return not self.findings

    @property
    def problems(self) -> tuple[Finding, ...]:
        """Alias of `findings` (same name as VerifyReport.problems)."""
        return self.findings

    def rule_ids(self) -> list[str]:
        return sorted({f.rule for f in self.findings})

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "artifact_dir": self.artifact_dir,
            "layout": self.layout,
            "tensors_checked": self.tensors_checked,
            "rules_run": list(self.rules_run),
            "findings": [{"rule": f.rule, "where": f.where, "message": f.message, "fix": f.fix} for f in self.findings],
        }


@dataclass(frozen=True)
class ArtifactFacts:
    """Everything the rules look at, read once from disk."""

    config: dict[str, Any]
    tensors: dict[str, TensorRef]
    weight_shapes: dict[str, tuple[int, ...]]  # module -> values of its weight_shape tensor
    io_findings: tuple[Finding, ...] = ()  # header / index problems found while reading
    unreadable: bool = False  # no config or no tensors: the other rules are skipped
    serve: dict[str, Any] = field(default_factory=dict)  # the manifest's recipe.serve (serve profiles), if any
    _memo: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    # -- derived views -----------------------------------------------------------------------
    @property
    def text_config(self) -> dict[str, Any]:
        return text_config(self.config)

    @property
    def layout(self) -> str | None:
        archs = self.config.get("architectures")
        archs = archs if isinstance(archs, list) else []
        if TEXT_ONLY_ARCH in archs:
            return "text-only"
        if MULTIMODAL_ARCH in archs:
            return "multimodal"
        return None

    @property
    def qconfig(self) -> dict[str, Any]:
        qc = self.config.get("quantization_config")
        return qc if isinstance(qc, dict) else {}

    @property
    def ignore(self) -> list[str]:
        ig = self.qconfig.get("ignore") or []
        return [e for e in ig if isinstance(e, str)] if isinstance(ig, list) else []

    @property
    def groups(self) -> dict[str, dict[str, Any]]:
        g = self.qconfig.get("config_groups")
        return {k: v for k, v in g.items() if isinstance(v, dict)} if isinstance(g, dict) else {}

    def modules(self) -> dict[str, dict[str, TensorRef]]:
        """module name -> {suffix: tensor} for `.weight` and the packed suffixes."""
        if "modules" in self._memo:
            return self._memo["modules"]
        out: dict[str, dict[str, TensorRef]] = self._memo.setdefault("modules", {})
        for name, t in self.tensors.items():
            mod, _, suffix = name.rpartition(".")
            if suffix == "weight" or suffix in PACKED_SUFFIXES:
                out.setdefault(mod, {})[suffix] = t
        return out

    def linears(self) -> dict[str, bool]:
        """Linear module -> stored packed? (2-D `.weight` that is not an embedding, or any packed module)."""
        if "linears" in self._memo:
            return self._memo["linears"]
        out: dict[str, bool] = self._memo.setdefault("linears", {})
        for mod, parts in self.modules().items():
            if "weight_packed" in parts:
                out[mod] = True
            elif "weight" in parts and len(parts["weight"].shape) == 2 and "embed" not in mod.rpartition(".")[2]:
                out[mod] = False
        return out

    def vllm_name(self, name: str) -> str:
        """The text-only loader maps `model.language_model.` to `model.` for tensors, ignore and targets."""
        if self.layout == "text-only" and name.startswith("model.language_model."):
            return "model." + name[len("model.language_model.") :]
        return name

    def resolve(self, module: str) -> str | None:
        """The config group vLLM would apply: IGNORED, a group name, or None (no group: unquantized)."""
        memo = self._memo.setdefault("resolve", {})
        if module not in memo:
            memo[module] = self._resolve(module)
        return memo[module]

    def _resolve(self, module: str) -> str | None:
        name = self.vllm_name(module)
        if targets_cover([self.vllm_name(e) for e in self.ignore], name):
            return IGNORED
        is_head = module.rpartition(".")[2] == "lm_head"
        for gname in sorted(self.groups):
            targets = self.groups[gname].get("targets") or []
            for t in targets if isinstance(targets, list) else []:
                if t == "Linear" and not is_head:
                    return gname
                if t != "Linear" and isinstance(t, str) and target_matches(self.vllm_name(t), name):
                    return gname
        return None

    def group_size(self, module: str) -> int | None:
        g = self.groups.get(self.resolve(module) or "", {})
        gs = (g.get("weights") or {}).get("group_size") if isinstance(g.get("weights"), dict) else None
        return gs if isinstance(gs, int) else None


def is_visual(name: str) -> bool:
    """A vision tower's tensor or module (`model.visual.*`, `visual.*`)."""
    return name.startswith(("model.visual.", "visual.")) or ".visual." in name


def is_head(name: str) -> bool:
    """The lm_head module (`lm_head` or `<prefix>.lm_head`)."""
    return name.rpartition(".")[2] == "lm_head" or name == "lm_head"


def finding(rule: str, where: str, message: str, fix: str) -> Finding:
    """A Finding, in the argument order every rule writes it."""
    return Finding(rule, where, message, fix)


# ---------------------------------------------------------------------------------------------
# Reading (thin).


def _read_weight_shape(t: TensorRef) -> tuple[int, ...] | None:
    fmt = {"I32": "<2i", "I64": "<2q"}.get(t.dtype)
    if fmt is None or t.shape != (2,):
        return None
    return struct.unpack(fmt, t.read())


def read_artifact(artifact_dir: Path) -> ArtifactFacts:
    """Read config.json, the index and every shard header (no tensor data but weight_shape)."""
    root = Path(artifact_dir)
    _refuse_non_artifact(root)
    io: list[Finding] = []
    config = _read_config(root, io)
    headers = _read_headers(root, io)
    weight_map = _read_index(root, headers, io)
    tensors, shapes = _tensors(root, headers, weight_map)
    log.debug("read %d tensors from %d shards", len(tensors), len(headers))
    return ArtifactFacts(
        config, tensors, shapes, tuple(io), unreadable=not config or not tensors, serve=_manifest_serve(root)
    )


def _refuse_non_artifact(root: Path) -> None:
    """A missing folder, a file, or a folder with neither config.json nor a shard is no artifact to check."""
    if not root.is_dir():
        raise CheckError(
            f"{root} is not a folder" if root.exists() else f"artifact folder not found: {root}",
            hint="pass the artifact folder (the one holding qwenquant-manifest.json)",
        )
    if not (root / "config.json").exists() and not any(root.glob("*.safetensors")):
        raise UsageError(
            f"{root} holds no config.json and no safetensors file: it is not an artifact",
            hint="pass the artifact folder (the one holding qwenquant-manifest.json)",
        )


def _read_config(root: Path, io: list[Finding]) -> dict[str, Any]:
    """config.json as a JSON object, else {} with its finding added to `io`."""
    try:
        config = json.loads((root / "config.json").read_bytes())
        if not isinstance(config, dict):
            raise ValueError("not a JSON object")
    except FileNotFoundError:
        config = {}
        io.append(finding("layout", "config.json", "missing", "copy it from the quantize stage's output"))
    except ValueError as e:
        config = {}
        io.append(finding("layout", "config.json", f"not valid JSON: {e}", "rebuild the artifact"))
    return config


def _read_headers(root: Path, io: list[Finding]) -> dict[str, SafetensorsHeader]:
    """{shard file name: header} of every readable shard; an unreadable one's problems go to `io`."""
    headers: dict[str, SafetensorsHeader] = {}
    for p in sorted(root.glob("*.safetensors")):
        try:
            headers[p.name] = read_header(p)
        except SafetensorsError as e:
            io += [
                finding("safetensors-header", p.name, prob, "the shard is corrupt or truncated: rebuild or re-copy it")
                for prob in e.problems
            ]
    return headers


def _read_index(root: Path, headers: dict[str, SafetensorsHeader], io: list[Finding]) -> dict[str, str] | None:
    """The index's weight_map (None without a readable one), checked against the shards; problems go to `io`."""
    index_path = root / INDEX_NAME
    weight_map: dict[str, str] | None = None
    if index_path.exists():
        try:
            index = load_index_json(index_path.read_bytes())
            files = {p.name for p in root.iterdir()}
            io += [
                finding("index", INDEX_NAME, prob, "rewrite the index from the shards' headers")
                for prob in check_index(index, headers, files)
            ]
            wm = index.get("weight_map")
            weight_map = wm if isinstance(wm, dict) else None
        except SafetensorsError as e:
            io += [finding("index", INDEX_NAME, prob, "rewrite the index") for prob in e.problems]
    elif len(headers) > 1:
        io.append(
            finding(
                "index",
                INDEX_NAME,
                f"missing while there are {len(headers)} shards",
                "write model.safetensors.index.json",
            )
        )
    elif not headers and not any(f.rule == "safetensors-header" for f in io):
        io.append(finding("index", "*.safetensors", "no safetensors files", "point at a quantized artifact folder"))
    return weight_map


def _tensors(
    root: Path, headers: dict[str, SafetensorsHeader], weight_map: dict[str, str] | None
) -> tuple[dict[str, TensorRef], dict[str, tuple[int, ...]]]:
    """The tensors vLLM would load (only the shards the index names) and each packed module's weight_shape."""
    tensors: dict[str, TensorRef] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    for fname, h in headers.items():
        if weight_map is not None and fname not in set(weight_map.values()):
            continue  # vLLM loads only the shards the index names (reported by the index rule)
        for name, t in header_refs(root / fname, h).items():
            tensors[name] = t
            if name.endswith(".weight_shape"):
                vals = _read_weight_shape(t)
                if vals is not None:
                    shapes[name.removesuffix(".weight_shape")] = vals
    return tensors, shapes


def _manifest_serve(root: Path) -> dict[str, Any]:
    """The serve section of the recipe the manifest records ({} without a readable manifest: verify reports that)."""
    from qwenquant.outfolder import MANIFEST_NAME

    try:
        serve = json.loads((root / MANIFEST_NAME).read_bytes()).get("recipe", {}).get("serve")
    except (OSError, ValueError, AttributeError):
        return {}
    return serve if isinstance(serve, dict) else {}
