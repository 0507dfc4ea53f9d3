"""The quant-config rule (pure): config.json's quantization_config is compressed-tensors' W4A16 as vLLM reads it,
pack-quantized, int4 symmetric weights in groups of a multiple of 32, activations left bf16."""

from __future__ import annotations

from typing import Any

from qwenquant.check.facts import ArtifactFacts, Finding, finding

WHERE = "config.json:quantization_config"
# The weights of every config group, as W4A16 has them (group_size: _group_size_finding).
W4A16_WEIGHTS = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group"}


def rule_quant_config(a: ArtifactFacts) -> list[Finding]:
    qc = a.config.get("quantization_config")
    if not isinstance(qc, dict):
        return [
            finding(
                "quant-config",
                WHERE,
                "missing: vLLM would load every weight as bf16 and find packed tensors",
                "re-run the quantize stage; it writes quantization_config",
            )
        ]
    out = []
    if qc.get("quant_method") != "compressed-tensors":
        out.append(
            finding(
                "quant-config",
                f"{WHERE}.quant_method",
                f"is {qc.get('quant_method')!r}, not 'compressed-tensors'",
                "set quant_method to compressed-tensors",
            )
        )
    if not a.groups:
        out.append(finding("quant-config", f"{WHERE}.config_groups", "no config groups", "re-run the quantize stage"))
    ig = qc.get("ignore", [])
    if not isinstance(ig, list) or not all(isinstance(e, str) for e in ig):
        out.append(finding("quant-config", f"{WHERE}.ignore", "must be a list of strings", "rewrite it as a list"))
    for gname, g in sorted(a.groups.items()):
        out += _group_findings(f"{WHERE}.config_groups.{gname}", g, qc.get("format"))
    return out


def _group_findings(gw: str, g: dict[str, Any], default_format: Any) -> list[Finding]:
    """One config group (`gw` names it): its format, targets, weights and input activations."""
    out = []
    fmt = g.get("format") or default_format
    if fmt != "pack-quantized":
        out.append(
            finding(
                "quant-config",
                gw,
                f"format is {fmt!r}, not 'pack-quantized'",
                "save with llm-compressor's pack-quantized compressor",
            )
        )
    if not isinstance(g.get("targets"), list) or not g["targets"]:
        out.append(finding("quant-config", f"{gw}.targets", "missing or empty", "list the Linear targets"))
    w = g.get("weights")
    if not isinstance(w, dict):
        out.append(finding("quant-config", f"{gw}.weights", "missing", "re-run the quantize stage"))
        return out
    out += _weights_findings(f"{gw}.weights", w)
    if g.get("input_activations") is not None:
        out.append(
            finding(
                "quant-config",
                f"{gw}.input_activations",
                "is set; W4A16 keeps activations in bf16",
                "set it to null",
            )
        )
    return out


def _weights_findings(ww: str, w: dict[str, Any]) -> list[Finding]:
    """A config group's weights (`ww` names them) against W4A16's."""
    out = [
        finding(
            "quant-config",
            f"{ww}.{k}",
            f"is {w.get(k)!r}; W4A16 needs {v!r}",
            "quantize with the shipped W4A16 recipe",
        )
        for k, v in W4A16_WEIGHTS.items()
        if w.get(k) != v
    ]
    gs = w.get("group_size")
    if not isinstance(gs, int) or gs <= 0 or gs % 32:
        out.append(
            finding(
                "quant-config",
                f"{ww}.group_size",
                f"is {gs!r}; needs a positive multiple of 32",
                "use group_size 128",
            )
        )
    return out
