"""Recipes: the one place YAML recipes and calibration definitions are parsed and validated.

`load_recipe("w4a16-int4head")` returns a typed, validated `Recipe`; every problem in a file is
collected and raised together as `RecipeError(message, problems=[...])`, each problem phrased
`field.path: what is wrong — how to fix`.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any, Literal, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator
from pydantic_core import PydanticCustomError

from qwenquant.atomic import canonical_json
from qwenquant.errors import RecipeError

SCHEMA_VERSION = 1
REQUIRED_PROFILES = ("single-user", "batch")
LM_HEAD_TARGET = "re:.*lm_head$"
# Module names the ignore rules are tested against, in both the HF (multimodal) and text-only layouts.
_MTP_MODULES = ("mtp.fc", "mtp.layers.0.self_attn.q_proj", "mtp.layers.0.mlp.down_proj")
_GDN_PREFIXES = ("model.language_model.layers.0.linear_attn.", "model.layers.0.linear_attn.")
_VISION_MODULES = ("model.visual.blocks.0.attn.qkv", "model.visual.merger.linear_fc1")
_LM_HEAD_MODULES = ("lm_head", "language_model.lm_head")
_HEX40 = re.compile(r"^[0-9a-f]{40}$")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)\s*$")
_SIZE_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
               "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
_PROFILE_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]*$")


def _fail(msg: str) -> PydanticCustomError:
    return PydanticCustomError("recipe_value", msg)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSpec(_Strict):
    """Which source checkpoints the recipe applies to (config.json `architectures`/`model_type`)."""

    architectures: list[str] = Field(min_length=1)
    model_types: list[str] = Field(min_length=1)


def _check_group_size(v: int) -> int:
    if v <= 0 or v % 32:
        raise _fail(f"must be a positive multiple of 32 for vLLM's CPU and Marlin kernels, got {v} — use 128")
    return v


def _check_num_bits(v: int) -> int:
    if v != 4:
        raise _fail(f"only 4-bit weights are supported (W4A16 pack-quantized), got {v} — set it to 4")
    return v


def _check_damp(v: float) -> float:
    if not 0 < v < 1:
        raise _fail(f"must be in (0, 1), got {v} — 0.01 is the usual value")
    return v


class QuantizationSpec(_Strict):
    """The body stage: GPTQ over every targeted Linear not in `ignore`."""

    method: Literal["gptq"] = "gptq"
    scheme: Literal["W4A16"] = "W4A16"
    num_bits: int = 4
    symmetric: bool = True
    group_size: int = 128
    actorder: Optional[Literal["static", "group", "weight"]] = "static"
    dampening_frac: float = 0.01
    block_size: int = Field(default=128, gt=0)
    sequential_targets: list[str] = Field(default_factory=lambda: ["Qwen3_5DecoderLayer"])
    targets: list[str] = Field(default_factory=lambda: ["Linear"], min_length=1)
    ignore: list[str] = Field(default_factory=list)
    restore_unquantized: bool = True

    @field_validator("group_size")
    @classmethod
    def check_group_size(cls, v: int) -> int:
        return _check_group_size(v)

    @field_validator("num_bits")
    @classmethod
    def check_num_bits(cls, v: int) -> int:
        return _check_num_bits(v)

    @field_validator("dampening_frac")
    @classmethod
    def check_dampening_frac(cls, v: float) -> float:
        return _check_damp(v)


class LmHeadSpec(_Strict):
    """The lm_head stage: int4 head calibrated on final-norm activations, its own config group."""

    enabled: bool = True
    method: Literal["gptq", "rtn"] = "gptq"
    num_bits: int = 4
    symmetric: bool = True
    group_size: int = 128
    dampening_frac: float = 0.01
    block_size: int = Field(default=128, gt=0)
    row_chunk: int = Field(default=8192, gt=0)
    target: str = LM_HEAD_TARGET
    heldout_fraction: float = Field(default=0.1, ge=0, lt=0.5)
    require_better_than_rtn: bool = True

    @field_validator("group_size")
    @classmethod
    def check_group_size(cls, v: int) -> int:
        return _check_group_size(v)

    @field_validator("num_bits")
    @classmethod
    def check_num_bits(cls, v: int) -> int:
        return _check_num_bits(v)

    @field_validator("dampening_frac")
    @classmethod
    def check_dampening_frac(cls, v: float) -> float:
        return _check_damp(v)

    @field_validator("target")
    @classmethod
    def _target(cls, v: str) -> str:
        if not all(_matches(v, m) for m in _LM_HEAD_MODULES):
            raise _fail(
                f"{v!r} does not match both `lm_head` and vLLM's `language_model.lm_head` — use "
                f"{LM_HEAD_TARGET!r} (vLLM does not remap a bare `lm_head` target)"
            )
        return v


class CalibrationSpec(_Strict):
    """Calibration text: a pinned Hub dataset revision or a local jsonl/parquet file."""

    source: Literal["hub", "local"]
    dataset: Optional[str] = None
    revision: Optional[str] = None
    split: str = "train"
    text_field: str = "text"
    path: Optional[str] = None
    num_samples: int = Field(gt=0)
    max_length: int = Field(gt=0)
    chat_template: bool = False
    shuffle_seed: Optional[int] = 42

    _base_dir: Optional[Path] = PrivateAttr(default=None)

    @field_validator("revision")
    @classmethod
    def _rev(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not _HEX40.match(v):
            raise _fail(f"must be a full 40-hex commit sha (pinned), got {v!r} — copy the commit id "
                        "from the dataset's history page")
        return v

    @field_validator("path")
    @classmethod
    def _path(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not v.endswith((".jsonl", ".parquet")):
            raise _fail(f"must name a .jsonl or .parquet file, got {v!r} — convert the data to jsonl")
        return v

    def resolved_path(self) -> Optional[Path]:
        """The local file, relative paths resolved against the folder of the YAML that named it."""
        if self.path is None:
            return None
        p = Path(self.path).expanduser()
        if not p.is_absolute() and self._base_dir is not None:
            p = self._base_dir / p
        return p

    def with_base_dir(self, base_dir: Path) -> "CalibrationSpec":
        """A copy whose relative `path` resolves against `base_dir`."""
        c = self.model_copy()
        c._base_dir = Path(base_dir).resolve()
        return c


class ArtifactSpec(_Strict):
    """The written artifact: config layout, dtype of unquantized tensors, shard size."""

    layout: Literal["text-only", "multimodal"] = "text-only"
    dtype: Literal["bfloat16"] = "bfloat16"
    max_shard_size: str = "5GB"

    @field_validator("max_shard_size")
    @classmethod
    def _size(cls, v: str) -> str:
        if not _SIZE.match(v):
            raise _fail(f"must be a size like '5GB' or '500MiB', got {v!r} — write a number and a unit")
        return v

    @property
    def max_shard_bytes(self) -> int:
        m = _SIZE.match(self.max_shard_size)
        assert m is not None  # validated above
        return int(float(m.group(1)) * _SIZE_UNITS[m.group(2)])


class SpeculativeSpec(_Strict):
    """vLLM `--speculative-config`; MTP uses the checkpoint's own draft head."""

    method: Literal["mtp"] = "mtp"
    num_speculative_tokens: int

    @field_validator("num_speculative_tokens")
    @classmethod
    def _n(cls, v: int) -> int:
        if v < 1:
            raise _fail(f"must be at least 1 for method mtp, got {v} — use 1-3, or set speculative: null")
        return v


class ServeSettings(_Strict):
    """vLLM settings; every key optional so a profile overrides only what it names."""

    served_model_name: Optional[str] = None
    host: Optional[str] = None
    port: Optional[int] = Field(default=None, ge=1, le=65535)
    kv_cache_dtype: Optional[Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16"]] = None
    mamba_ssm_cache_dtype: Optional[Literal["auto", "float16", "bfloat16", "float32"]] = None
    mamba_cache_mode: Optional[str] = None
    reasoning_parser: Optional[str] = None
    max_num_batched_tokens: Optional[int] = Field(default=None, gt=0)
    speculative: Optional[SpeculativeSpec] = None
    max_model_len: Optional[int] = Field(default=None, gt=0)
    max_num_seqs: Optional[int] = Field(default=None, gt=0)
    gpu_memory_utilization: Optional[float] = None
    enforce_eager: Optional[bool] = None
    enable_prefix_caching: Optional[bool] = None
    extra_args: Optional[list[str]] = None

    @field_validator("gpu_memory_utilization")
    @classmethod
    def _gmu(cls, v: Optional[float]) -> Optional[float]:
        if v is not None and not 0 < v <= 1:
            raise _fail(f"must be in (0, 1], got {v} — it is the fraction of GPU memory vLLM may use")
        return v


class ServeProfile(ServeSettings):
    description: str = ""


class ResolvedProfile(_Strict):
    """serve.defaults merged with one profile: every setting decided."""

    name: str
    description: str
    served_model_name: str
    host: str
    port: int
    kv_cache_dtype: str
    mamba_ssm_cache_dtype: str
    mamba_cache_mode: Optional[str]
    reasoning_parser: Optional[str]
    max_num_batched_tokens: Optional[int]
    speculative: Optional[SpeculativeSpec]
    max_model_len: int
    max_num_seqs: int
    gpu_memory_utilization: float
    enforce_eager: bool
    enable_prefix_caching: Optional[bool]  # None: vLLM's default
    extra_args: list[str]


_RESOLVED_DEFAULTS: dict[str, Any] = {
    "served_model_name": "qwenquant", "host": "127.0.0.1", "port": 8000, "kv_cache_dtype": "auto",
    "mamba_ssm_cache_dtype": "auto", "mamba_cache_mode": None, "reasoning_parser": None,
    "max_num_batched_tokens": None, "speculative": None, "enforce_eager": False,
    "enable_prefix_caching": None, "extra_args": [],
}
_PROFILE_REQUIRED = ("max_model_len", "max_num_seqs", "gpu_memory_utilization")


class ServeSpec(_Strict):
    vllm_versions: list[str] = Field(default_factory=lambda: [">=0.26.0"])
    defaults: ServeSettings = Field(default_factory=ServeSettings)
    profiles: dict[str, ServeProfile]

    @field_validator("vllm_versions")
    @classmethod
    def _specs(cls, v: list[str]) -> list[str]:
        try:
            from packaging.specifiers import InvalidSpecifier, SpecifierSet
        except ImportError:  # packaging comes with transformers; without it skip the syntax check
            return v
        bad = []
        for s in v:
            try:
                SpecifierSet(s)
            except InvalidSpecifier:
                bad.append(s)
        if bad:
            raise _fail(f"not PEP 440 version specifiers: {bad} — write e.g. '>=0.26.0'")
        return v


class Recipe(_Strict):
    """A validated recipe; attribute names are the YAML keys."""

    schema_version: Literal[1]
    name: str = Field(min_length=1)
    description: str = ""
    model: ModelSpec
    quantization: QuantizationSpec
    lm_head: LmHeadSpec
    calibration: CalibrationSpec
    artifact: ArtifactSpec
    serve: ServeSpec

    _source_path: Optional[Path] = PrivateAttr(default=None)

    @property
    def source_path(self) -> Optional[Path]:
        """The YAML file this recipe was loaded from (None when built in code)."""
        return self._source_path

    def canonical(self) -> dict[str, Any]:
        """JSON-ready dict with every default filled in; what `sha256()` and manifests record.

        serve.profiles are written resolved (defaults merged in) and serve.defaults only with the
        keys it sets, so `Recipe.model_validate(r.canonical())` has the same profiles and digest.
        """
        d = self.model_dump(mode="json")
        d["serve"]["defaults"] = {k: v for k, v in d["serve"]["defaults"].items()
                                  if k in self.serve.defaults.model_fields_set}
        d["serve"]["profiles"] = {n: self.profile(n).model_dump(mode="json", exclude={"name"})
                                  for n in sorted(self.serve.profiles)}
        return d

    def sha256(self) -> str:
        """sha256 of the canonical JSON: two recipes with the same meaning have the same digest."""
        return hashlib.sha256(canonical_json(self.canonical())).hexdigest()

    def profile(self, name: str) -> ResolvedProfile:
        """serve.defaults merged with serve.profiles[name] (keys the profile names win, null included)."""
        if name not in self.serve.profiles:
            raise RecipeError(
                f"recipe {self.name!r} has no serve profile {name!r}",
                hint=f"pick one of: {', '.join(sorted(self.serve.profiles))}",
            )
        prof = self.serve.profiles[name]
        merged: dict[str, Any] = dict(_RESOLVED_DEFAULTS)
        for src in (self.serve.defaults, prof):
            for key in src.model_fields_set:
                if key != "description":
                    merged[key] = getattr(src, key)
        missing = [k for k in _PROFILE_REQUIRED if merged.get(k) is None]
        if missing:  # validation already rejects this for loaded recipes
            raise RecipeError(f"serve profile {name!r} leaves {', '.join(missing)} unset",
                              hint="set them in serve.defaults or the profile")
        if merged["extra_args"] is None:
            merged["extra_args"] = []
        return ResolvedProfile(name=name, description=prof.description, **merged)

    def with_calibration(self, calibration: CalibrationSpec) -> "Recipe":
        """A copy with its calibration replaced (`--calibration tiny-demo`)."""
        r = self.model_copy(update={"calibration": calibration})
        r._source_path = self._source_path
        return r


# ---------------------------------------------------------------------------------------------
# Cross-field rules: run on the raw mapping so they are reported even when other fields fail.


def _matches(entry: str, module: str) -> bool:
    """compressed-tensors / vLLM matching: `re:` prefix is re.match, anything else equality."""
    if entry.startswith("re:"):
        try:
            return re.match(entry[3:], module) is not None
        except re.error:
            return False
    return entry == module


def _covered(entries: list[str], module: str) -> bool:
    return any(_matches(e, module) for e in entries)


# Public names for other modules (check.py) that match config-group targets and ignore entries.
target_matches = _matches
targets_cover = _covered


def _get(d: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(d, dict) or part not in d:
            return None
        d = d[part]
    return d


def _cross_field_problems(raw: dict[str, Any]) -> list[str]:
    """Rules spanning several fields; every lookup tolerates wrong types (reported elsewhere)."""
    p: list[str] = []
    ignore = _get(raw, "quantization.ignore")
    if isinstance(ignore, list) and all(isinstance(e, str) for e in ignore):
        for e in ignore:
            if e.startswith("re:"):
                try:
                    re.compile(e[3:])
                except re.error as err:
                    p.append(f"quantization.ignore: {e!r} is not a valid regular expression ({err}) — fix the pattern")
        if not all(_covered(ignore, m) for m in _MTP_MODULES):
            p.append("quantization.ignore: must cover the MTP draft head — add 're:^mtp.*' (a quantized "
                     "mtp.fc crashes vLLM's loader: 'no parameter fc.weight', vLLM #53387)")
        for gate in ("in_proj_a", "in_proj_b"):
            if not all(_covered(ignore, pre + gate) for pre in _GDN_PREFIXES):
                p.append(f"quantization.ignore: must cover the fused GDN gate {gate} — add "
                         f"'re:.*linear_attn.{gate}$' (vLLM fuses in_proj_b+in_proj_a into one layer that "
                         "needs one scheme, and their 48 rows do not fill a 64-row Marlin tile)")
        for group in (("in_proj_qkv", "in_proj_z"), ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
                      ("mlp.gate_proj", "mlp.up_proj")):
            for pre in ("model.language_model.layers.3.", "model.layers.3."):
                mods = [pre + ("linear_attn." + g if g.startswith("in_proj") else g) for g in group]
                flags = [_covered(ignore, m) for m in mods]
                if any(flags) and not all(flags):
                    names = ", ".join(g.split(".")[-1] for g in group)
                    p.append(f"quantization.ignore: ignores some but not all of {names} — vLLM fuses them into "
                             "one layer and refuses mixed schemes; ignore all of them or none")
                    break
        if not all(_covered(ignore, m) for m in _VISION_MODULES):
            p.append("quantization.ignore: must cover the vision tower — add 're:.*visual.*' (text calibration "
                     "never reaches it, so GPTQ has no statistics for it)")
        if not _covered(ignore, "lm_head"):
            enabled = _get(raw, "lm_head.enabled")
            why = ("the lm_head stage quantizes it into its own config group" if enabled is not False else
                   "vLLM does not quantize lm_head through the 'Linear' target, so a packed head would not load")
            p.append(f"quantization.ignore: must include 'lm_head' — {why}; add 'lm_head'")
    cal = raw.get("calibration")
    if isinstance(cal, dict):
        p += _calibration_problems(cal, "calibration.")
    profiles = _get(raw, "serve.profiles")
    if isinstance(profiles, dict):
        for need in REQUIRED_PROFILES:
            if need not in profiles:
                p.append(f"serve.profiles: missing the {need!r} profile — add serve.profiles.{need}")
        defaults = _get(raw, "serve.defaults") or {}
        for name, prof in profiles.items():
            if not isinstance(name, str) or not _PROFILE_NAME.match(name):
                p.append(f"serve.profiles.{name}: profile names are lower-case letters, digits, '-' and '_' — rename it")
            if not isinstance(prof, dict) or not isinstance(defaults, dict):
                continue
            for key in _PROFILE_REQUIRED:
                if prof.get(key) is None and defaults.get(key) is None:
                    p.append(f"serve.profiles.{name}.{key}: not set here nor in serve.defaults — add it")
    return p


def _calibration_problems(cal: dict[str, Any], prefix: str) -> list[str]:
    p: list[str] = []
    src = cal.get("source")
    if src == "hub":
        if not cal.get("dataset"):
            p.append(f"{prefix}dataset: required when source is hub — name the dataset repo, e.g. HuggingFaceH4/ultrachat_200k")
        if cal.get("revision") is None:
            p.append(f"{prefix}revision: required when source is hub (calibration data must be pinned) — "
                     "add the dataset's 40-hex commit sha")
        if cal.get("path") is not None:
            p.append(f"{prefix}path: only for source local — remove it or set source: local")
    elif src == "local":
        if not cal.get("path"):
            p.append(f"{prefix}path: required when source is local — name a .jsonl or .parquet file "
                     "(relative paths resolve against the YAML's folder)")
    return p


# ---------------------------------------------------------------------------------------------
# Turning pydantic errors into `path: what — fix` lines.


def _model_at(root: type[BaseModel], loc: tuple[Any, ...]) -> Optional[type[BaseModel]]:
    """The model class that owns the field at `loc` (used to list allowed keys)."""
    import types
    import typing

    cls: Any = root
    for part in loc:
        if isinstance(part, int):
            continue
        if isinstance(cls, type) and issubclass(cls, BaseModel):
            f = cls.model_fields.get(str(part))
            if f is None:
                return None
            cls = f.annotation
        elif typing.get_origin(cls) is dict:
            cls = typing.get_args(cls)[1]
        else:
            return None
        while typing.get_origin(cls) in (typing.Union, getattr(types, "UnionType", None)):
            args = [a for a in typing.get_args(cls) if a is not type(None)]
            cls = args[0] if len(args) == 1 else None
    return cls if isinstance(cls, type) and issubclass(cls, BaseModel) else None


_TYPE_WORDS = {
    "model_type": "a mapping (key: value lines)", "model_attributes_type": "a mapping (key: value lines)",
    "dict_type": "a mapping (key: value lines)", "list_type": "a list", "string_type": "a string",
    "int_type": "an integer", "int_parsing": "an integer", "int_from_float": "an integer",
    "float_type": "a number", "float_parsing": "a number", "bool_type": "true or false",
    "bool_parsing": "true or false",
}


def _format_error(err: dict[str, Any], root: type[BaseModel], lines: dict[tuple, int]) -> str:
    loc = tuple(err["loc"])
    path = ".".join(str(x) for x in loc) or "(top level)"
    kind = err["type"]
    if kind == "extra_forbidden":
        parent = _model_at(root, loc[:-1])
        allowed = f" (allowed: {', '.join(sorted(parent.model_fields))})" if parent else ""
        msg = f"unknown key — remove it or fix its spelling{allowed}"
    elif kind == "missing":
        msg = "required key is missing — add it"
    elif kind == "recipe_value":
        msg = err["msg"]
    elif kind in ("literal_error", "enum"):
        msg = f"{err['msg'].replace('Input should be', 'must be')}, got {err.get('input')!r} — use one of those values"
    elif kind in _TYPE_WORDS:
        msg = f"must be {_TYPE_WORDS[kind]}, got {err.get('input')!r} — write {_TYPE_WORDS[kind]}"
    else:
        msg = f"{err['msg'].replace('Input should be', 'must be')}, got {err.get('input')!r} — fix the value"
    line = lines.get(loc) or lines.get(loc[:-1])
    return f"{path}: {msg}" + (f" (line {line})" if line else "")


# ---------------------------------------------------------------------------------------------
# YAML reading: syntax errors with line numbers, duplicate keys refused.


class _UniqueKeyLoader(yaml.SafeLoader):
    pass


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first on line {seen[key]})", key_node.start_mark)
        seen[key] = line
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _key_lines(node: Any, prefix: tuple = ()) -> dict[tuple, int]:
    out: dict[tuple, int] = {}
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            loc = prefix + (k.value,)
            out[loc] = k.start_mark.line + 1
            out.update(_key_lines(v, loc))
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            out[prefix + (i,)] = v.start_mark.line + 1
            out.update(_key_lines(v, prefix + (i,)))
    return out


def _read_yaml(path: Path, what: str) -> tuple[dict[str, Any], dict[tuple, int]]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RecipeError(f"{what} file not found: {path}", hint="check the path") from None
    except (OSError, UnicodeDecodeError) as e:
        raise RecipeError(f"cannot read {what} {path}: {e}") from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (SafeLoader subclass)
        lines = _key_lines(yaml.compose(text, Loader=yaml.SafeLoader))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        problem = getattr(e, "problem", None) or str(e)
        raise RecipeError(f"{what} {path} is not valid YAML",
                          problems=[f"{where}: {problem} — fix the YAML syntax there"]) from None
    if not isinstance(data, dict):
        raise RecipeError(f"{what} {path} is not valid",
                          problems=[f"(top level): must be a mapping of keys, got {type(data).__name__} — "
                                    "start from a shipped file (`qwenquant recipe show w4a16-int4head`)"])
    return data, lines


# ---------------------------------------------------------------------------------------------
# Public loaders.


def recipes_dir() -> Path:
    """Shipped recipes: $QWENQUANT_RECIPES_DIR or the repository's recipes/ folder."""
    env = os.environ.get("QWENQUANT_RECIPES_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "recipes"


def calibration_dir() -> Path:
    """Shipped calibration definitions: $QWENQUANT_CALIBRATION_DIR or the repository's calibration/."""
    env = os.environ.get("QWENQUANT_CALIBRATION_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "calibration"


def list_recipes() -> dict[str, Path]:
    """Shipped recipe names and their files."""
    d = recipes_dir()
    return {p.stem: p for p in sorted(d.glob("*.yaml"))} if d.is_dir() else {}


def list_calibrations() -> dict[str, Path]:
    """Shipped calibration definition names and their files."""
    d = calibration_dir()
    return {p.stem: p for p in sorted(d.glob("*.yaml"))} if d.is_dir() else {}


def _resolve(name_or_path: str | Path, shipped: dict[str, Path], what: str) -> Path:
    s = str(name_or_path)
    p = Path(s).expanduser()
    if isinstance(name_or_path, Path) or p.suffix in (".yaml", ".yml") or "/" in s or os.sep in s or p.is_file():
        return p
    if s in shipped:
        return shipped[s]
    raise RecipeError(f"no shipped {what} named {s!r}",
                      hint=f"shipped: {', '.join(shipped) or '(none)'}; or pass a path to a YAML file")


def load_recipe(name_or_path: str | Path) -> Recipe:
    """Load and validate a recipe by shipped name (`w4a16-int4head`) or path; RecipeError lists every problem."""
    path = _resolve(name_or_path, list_recipes(), "recipe")
    raw, lines = _read_yaml(path, "recipe")
    return _validate(raw, lines, path)


def parse_recipe(raw: dict[str, Any], *, base_dir: Path | None = None) -> Recipe:
    """Validate an already-parsed mapping (tests, programmatic edits); same rules as load_recipe."""
    return _validate(raw, {}, None, base_dir=base_dir)


def _validate(raw: dict[str, Any], lines: dict[tuple, int], path: Path | None,
              base_dir: Path | None = None) -> Recipe:
    problems: list[str] = []
    recipe: Recipe | None = None
    try:
        recipe = Recipe.model_validate(raw)
    except ValidationError as e:
        problems += [_format_error(err, Recipe, lines) for err in e.errors()]
    for prob in _cross_field_problems(raw):
        if prob not in problems:
            problems.append(_with_line(prob, lines))
    if problems or recipe is None:
        where = path if path is not None else "recipe"
        raise RecipeError(f"{where} is invalid ({len(problems)} problem{'s' * (len(problems) != 1)})",
                          problems=problems, hint="fix each field named above, then `qwenquant recipe validate FILE`")
    base = base_dir or (path.resolve().parent if path is not None else None)
    if base is not None:
        recipe = recipe.model_copy(update={"calibration": recipe.calibration.with_base_dir(base)})
    recipe._source_path = path.resolve() if path is not None else None
    return recipe


def _with_line(problem: str, lines: dict[tuple, int]) -> str:
    path = problem.split(":", 1)[0]
    line = lines.get(tuple(path.split(".")))
    return problem + (f" (line {line})" if line else "")


_CALIBRATION_META = ("schema_version", "name", "description")


def load_calibration_override(name_or_path: str | Path) -> CalibrationSpec:
    """Load a calibration definition (shipped name like `tiny-demo`, or a path to its YAML).

    The file holds CalibrationSpec keys at top level, plus optional schema_version/name/description.
    A relative `path` resolves against the YAML's folder.
    """
    path = _resolve(name_or_path, list_calibrations(), "calibration definition")
    raw, lines = _read_yaml(path, "calibration definition")
    body = {k: v for k, v in raw.items() if k not in _CALIBRATION_META}
    problems: list[str] = []
    if raw.get("schema_version", SCHEMA_VERSION) != SCHEMA_VERSION:
        problems.append(f"schema_version: must be {SCHEMA_VERSION}, got {raw.get('schema_version')!r} — set it to 1")
    spec: CalibrationSpec | None = None
    try:
        spec = CalibrationSpec.model_validate(body)
    except ValidationError as e:
        problems += [_format_error(err, CalibrationSpec, lines) for err in e.errors()]
    problems += [_with_line(x, lines) for x in _calibration_problems(body, "")]
    if problems or spec is None:
        raise RecipeError(f"calibration definition {path} is invalid", problems=problems,
                          hint="fix each field named above")
    return spec.with_base_dir(path.resolve().parent)
