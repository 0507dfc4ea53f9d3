"""Read a checkpoint or an artifact as dense float tensors under one naming (`model.*`, `lm_head.*`, `mtp.*`).

Quantized modules (`*.weight_packed`, `*.weight_scale`, `*.weight_shape`) are dequantized with
compressed-tensors' own `PackedQuantizationCompressor.decompress`, using the scheme of the
config group that targets the module, so both arms of an eval run the same dense arithmetic.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from qwenquant.checkpoint.config import read_config, text_config
from qwenquant.checkpoint.names import LM_PREFIX
from qwenquant.errors import QwenquantError
from qwenquant.recipe.targets import target_matches

PACK_SUFFIXES = ("weight_packed", "weight_scale", "weight_shape", "weight_zero_point")


def normalize_name(name: str) -> str | None:
    """Checkpoint name -> the text-only naming; None for tensors eval does not use (vision tower)."""
    if name.startswith(LM_PREFIX):
        return "model." + name[len(LM_PREFIX) :]
    if name.startswith("model.visual.") or name.startswith("visual."):
        return None
    return name


def raw_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of every *.safetensors file in `folder`, names normalized (vision dropped)."""
    from safetensors.torch import load_file

    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise QwenquantError(f"{folder} has no .safetensors files", hint="pass a checkpoint or artifact folder")
    out: dict[str, torch.Tensor] = {}
    for f in files:
        for name, t in load_file(f).items():
            key = normalize_name(name)
            if key is not None:
                out[key] = t
    return out


def _group_for(module: str, groups: dict[str, Any]) -> dict[str, Any]:
    """The config group whose targets match `module` (by name: `re:` or exact), else the `Linear` group."""
    fallback = None
    for group in groups.values():
        for target in group.get("targets", []):
            if target == "Linear":
                fallback = group
            elif target_matches(target, module):
                return group
    if fallback is None:
        raise QwenquantError(
            f"no quantization config group targets {module}", hint="run `qwenquant check` on the artifact"
        )
    return fallback


def dequantize(tensors: dict[str, torch.Tensor], config: dict[str, Any]) -> dict[str, torch.Tensor]:
    """`tensors` with every packed module replaced by its dequantized `.weight` (float32)."""
    from qwenquant.modeling.compat import unpack_group

    groups = (config.get("quantization_config") or {}).get("config_groups") or {}
    modules = sorted(n[: -len(".weight_packed")] for n in tensors if n.endswith(".weight_packed"))
    out = {n: t for n, t in tensors.items() if n.rsplit(".", 1)[-1] not in PACK_SUFFIXES}
    for module in modules:
        local = {s: tensors[f"{module}.{s}"] for s in PACK_SUFFIXES if f"{module}.{s}" in tensors}
        out[f"{module}.weight"] = unpack_group(local, _group_for(module, groups)).float()
    return {n: t.float() for n, t in out.items()}


def load_dense(folder: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(text config, float32 tensors with quantized modules dequantized) of a checkpoint or artifact."""
    config = read_config(folder)
    return text_config(config), dequantize(raw_tensors(folder), config)


def rtn_head(weight: torch.Tensor, group_size: int = 128) -> torch.Tensor:
    """Round-to-nearest symmetric int4 of `weight`, dequantized on `weight`'s device (the lm_head
    stage's baseline)."""
    from qwenquant.modeling.int4 import rtn_quantize_rows

    q = rtn_quantize_rows(weight, group_size=group_size, device=weight.device)
    q = dataclasses.replace(q, int=q.int.to(weight.device), scale=q.scale.to(weight.device))
    return q.dequantize(torch.float32)
