"""Does an artifact qualify for int8 activations (VLLM_MARLIN_INPUT_DTYPE=int8)?

With the variable set, vLLM's compressed-tensors W4A16 scheme hands Marlin int8 per-token activations on
every layer Marlin runs (lm_head and the MTP head included; schemes/compressed_tensors_wNa16.py), and
Marlin (kernels/linear/mixed_precision/marlin.py, utils/marlin_utils.py, vLLM 0.32) then:
- asserts the weight type is uint4b8 ("W8A8 is not supported by marlin kernel"): an 8-bit layer or an
  asymmetric one (uint4 with zero points) stops the engine at load;
- re-quantizes the group scales only when a layer has more than one group: a channelwise layer keeps no
  input_global_scale and its first forward fails;
- re-quantizes the scales to int16 relative to the layer's largest, in the scales' dtype:
  `s / s.max() * 4096` rounded, so a group below max/8192 becomes 0 (its weights read as zero) and a
  negative scale corrupts the output (vllm #48905).
The layer is vLLM's: the parts it fuses (q/k/v, gate/up, the GDN projections) share one maximum.

`int8_findings` is pure (facts and the scale statistics in); `read_scale_stats` reads the scales (thin).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from qwenquant.check.facts import IGNORED, ArtifactFacts, CheckReport, Finding, finding
from qwenquant.check.rules import PART_OF
from qwenquant.checkpoint.names import is_mtp

RULE = "int8-activations"
SCALE_STEPS = 4096  # marlin_act_int8_process_scales: s / s.max() * 4096, rounded to int16
_FIX_SCHEME = "serve with --activations bf16, or re-quantize with a symmetric group-wise 4-bit recipe"


@dataclass(frozen=True)
class LayerScales:
    """One vLLM layer's group scales as Marlin's int8 path sees them."""

    layer: str  # vLLM's layer (fused parts joined), as stored: e.g. model.layers.3.self_attn.qkv_proj
    kind: str  # qkv_proj, gate_up_proj, lm_head, ...; "mtp " first for the MTP head's layers
    groups: int
    negative: int  # groups whose scale is below zero
    zero: int  # groups whose scale re-quantizes to 0
    per_row: int = 2  # groups along the input (vLLM keeps an activation scale only above one)


@dataclass(frozen=True)
class Int8Report:
    """What `check --activations int8` and serve's preflight found: refusals and the zero-scale count."""

    findings: tuple[Finding, ...]
    layers: tuple[LayerScales, ...] = ()
    zero_by_kind: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.findings

    @property
    def zero_groups(self) -> int:
        return sum(self.zero_by_kind.values())

    @property
    def groups(self) -> int:
        return sum(x.groups for x in self.layers)

    def warning(self) -> str | None:
        """The one line a nonzero count gives (None when no group rounds to zero)."""
        if not self.zero_groups:
            return None
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(self.zero_by_kind.items()) if n)
        return (
            f"int8 activations: {self.zero_groups} of {self.groups} weight groups have a scale below 1/8192 "
            f"of their layer's largest and become 0 when vLLM re-quantizes the scales to int16 ({kinds}); "
            "those groups' weights read as zero"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "groups": self.groups,
            "zero_groups": self.zero_groups,
            "zero_groups_by_kind": dict(sorted(self.zero_by_kind.items())),
            "findings": [{"rule": f.rule, "where": f.where, "message": f.message, "fix": f.fix} for f in self.findings],
        }


def vllm_layer(module: str) -> str:
    """The vLLM layer a checkpoint Linear loads into (q_proj -> qkv_proj, gate_proj -> gate_up_proj, ...)."""
    head, _, leaf = module.rpartition(".")
    fused = PART_OF.get(leaf, leaf)
    return f"{head}.{fused}" if head else fused


def layer_kind(layer: str) -> str:
    leaf = layer.rpartition(".")[2]
    return f"mtp {leaf}" if is_mtp(layer) else leaf


def marlin_modules(a: ArtifactFacts) -> dict[str, dict[str, Any]]:
    """Packed (quantized) module -> the weights section of the config group vLLM applies to it."""
    out: dict[str, dict[str, Any]] = {}
    for mod, packed in sorted(a.linears().items()):
        group = a.resolve(mod)
        if not packed or group in (None, IGNORED):
            continue
        w = a.groups.get(group or "", {}).get("weights")
        out[mod] = w if isinstance(w, dict) else {}
    return out


def scheme_findings(a: ArtifactFacts) -> list[Finding]:
    """The config-group refusals: an 8-bit, asymmetric or channelwise layer (one finding per group)."""
    out: list[Finding] = []
    by_group: dict[str, list[str]] = {}
    for mod in marlin_modules(a):
        by_group.setdefault(str(a.resolve(mod)), []).append(mod)
    for gname, mods in sorted(by_group.items()):
        w = a.groups.get(gname, {}).get("weights") or {}
        where = f"quantization_config.config_groups.{gname}"
        first = f"{mods[0]}" + (f" and {len(mods) - 1} more" if len(mods) > 1 else "")
        bits = w.get("num_bits")
        if bits != 4 or w.get("type", "int") != "int":
            out.append(
                finding(
                    RULE,
                    where,
                    f"{bits}-bit {w.get('type', 'int')} weights ({first}): vLLM's Marlin "
                    "takes int8 activations only with 4-bit weights and stops at load "
                    "with any other Marlin layer",
                    _FIX_SCHEME,
                )
            )
        if w.get("symmetric") is False:
            out.append(
                finding(
                    RULE,
                    where,
                    f"asymmetric weights (zero points; {first}): Marlin's int8 path takes "
                    "only symmetric uint4b8 weights and stops at load",
                    _FIX_SCHEME,
                )
            )
        gs = w.get("group_size")
        if w.get("strategy") in ("channel", "tensor") or not isinstance(gs, int) or gs <= 0:
            out.append(
                finding(
                    RULE,
                    where,
                    f"strategy {w.get('strategy')!r}, group_size {gs} ({first}): int8 "
                    "activations need group-wise scales (a channelwise layer gets no "
                    "activation scale and fails at its first forward)",
                    _FIX_SCHEME,
                )
            )
    return out


def int8_findings(a: ArtifactFacts, stats: Mapping[str, LayerScales]) -> Int8Report:
    """The int8-activation report from the facts and each layer's scale statistics (pure)."""
    findings = scheme_findings(a)
    for s in stats.values():
        if s.negative:
            findings.append(
                finding(
                    RULE,
                    f"{s.layer}.weight_scale",
                    f"{s.negative} of {s.groups} group scales are negative: with int8 activations "
                    "vLLM's Marlin re-quantizes them to wrong values and the output is corrupt "
                    "(vllm #48905)",
                    "serve with --activations bf16, or re-quantize (GPTQ writes non-negative scales)",
                )
            )
        if s.per_row == 1:
            findings.append(
                finding(
                    RULE,
                    f"{s.layer}.weight_scale",
                    "one scale group per row (the input is no wider than group_size): vLLM keeps "
                    "no activation scale for such a layer with int8 activations and fails at its "
                    "first forward",
                    "serve with --activations bf16",
                )
            )
    zero: dict[str, int] = {}
    for s in stats.values():
        zero[s.kind] = zero.get(s.kind, 0) + s.zero
    return Int8Report(tuple(findings), tuple(stats.values()), zero)


def served_dtype(a: ArtifactFacts) -> str:
    """The dtype vLLM holds the scales in (the model's: `--dtype auto`)."""
    d = (
        a.text_config.get("torch_dtype")
        or a.text_config.get("dtype")
        or a.config.get("torch_dtype")
        or a.config.get("dtype")
        or "bfloat16"
    )
    return "float16" if str(d) in ("float16", "half") else "bfloat16"


def _as_served(values: Any, dtype: str) -> Any:
    """float32 values rounded to the served dtype (round to nearest even), back as float32."""
    import numpy as np

    if dtype == "float16":
        return values.astype(np.float16).astype(np.float32)
    u = values.astype(np.float32).view(np.uint32)
    u = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return u.view(np.float32)


def _float32(raw: bytes, dtype: str) -> Any:
    import numpy as np

    if dtype == "BF16":
        return (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << np.uint32(16)).view(np.float32)
    if dtype == "F16":
        return np.frombuffer(raw, dtype="<f2").astype(np.float32)
    if dtype == "F32":
        return np.frombuffer(raw, dtype="<f4").astype(np.float32)
    raise ValueError(f"scale dtype {dtype}")


def layer_stats(layer: str, parts: list[Any], dtype: str, per_row: int = 2) -> LayerScales:
    """One layer's statistics from its parts' scales (float32 arrays), as vLLM's
    marlin_act_int8_process_scales computes in the served dtype: s / s.max() * 4096, rounded."""
    import numpy as np

    s = _as_served(np.concatenate([p.ravel() for p in parts]), dtype)
    top = float(s.max()) if s.size else 0.0
    negative = int((s < 0).sum())
    if top > 0:
        q = _as_served(s / np.float32(top), dtype) * np.float32(SCALE_STEPS)
        zero = int((np.rint(q) == 0).sum())  # rint: half to even, as torch.round
    else:
        zero = int(s.size)
    return LayerScales(layer, layer_kind(layer), int(s.size), negative, zero, per_row)


def read_scale_stats(a: ArtifactFacts) -> dict[str, LayerScales]:
    """Every Marlin layer's scale statistics, read from the shards (thin: one read per scale tensor)."""
    dtype = served_dtype(a)
    parts: dict[str, list[Any]] = {}
    per_row: dict[str, int] = {}
    for mod in marlin_modules(a):
        ref = a.modules().get(mod, {}).get("weight_scale")
        if ref is None:
            continue  # packed-format reports the missing tensor
        try:
            values = _float32(ref.read(), ref.dtype)
        except ValueError:
            continue  # packed-format reports a scale of another dtype
        parts.setdefault(vllm_layer(mod), []).append(values)
        per_row[vllm_layer(mod)] = int(ref.shape[-1]) if len(ref.shape) == 2 else 1
    return {layer: layer_stats(layer, p, dtype, per_row[layer]) for layer, p in sorted(parts.items())}


def check_int8_activations(a: ArtifactFacts) -> Int8Report:
    """The int8 report for facts already read (reads the scale tensors)."""
    return int8_findings(a, read_scale_stats(a))


@dataclass(frozen=True)
class Int8Check:
    """`check --activations int8`: the check report with the int8 findings added, and the int8 report."""

    report: CheckReport
    int8: Int8Report

    def warning(self) -> str | None:
        return self.int8.warning()

    def to_dict(self) -> dict[str, Any]:
        return self.int8.to_dict()


def int8_asked(flag: str | None, a: ArtifactFacts) -> bool:
    """--activations int8, or (without the flag) a serve profile of the recipe the manifest records asks for it."""
    if flag is not None:
        return flag == "int8"
    profiles = a.serve.get("profiles") if isinstance(a.serve, dict) else None
    return isinstance(profiles, dict) and any(
        isinstance(p, dict) and p.get("activations") == "int8" for p in profiles.values()
    )


def int8_check(a: ArtifactFacts, report: CheckReport) -> Int8Check:
    """The check report with the int8 rule run (its findings appended) and the int8 report."""
    int8 = check_int8_activations(a) if not a.unreadable else Int8Report(())
    merged = dataclasses.replace(
        report, rules_run=(*report.rules_run, RULE), findings=(*report.findings, *int8.findings)
    )
    return Int8Check(merged, int8)
