"""vLLM's int8-activation Marlin path (`VLLM_MARLIN_INPUT_DTYPE=int8`), simulated offline on int4 weights.

What vLLM does (read in vLLM 0.32; W4A8-INT8 from vllm #24722, compressed-tensors wiring #31572):
  activations  `per_token_quant_int8` (quantization/utils/int8_utils.py): per token (row),
               absmax = max(max|x|, 1e-10) in float32, a = absmax / 127, q = round(x * (127 / absmax))
               (libdevice round: half away from zero; |q| <= 127, so no clamp is needed)
  scales       `marlin_act_int8_process_scales` (quantization/utils/marlin_utils.py), at load, only
               when the layer (partition) has more than one group: s16 = round(s / s.max() * 4096) in
               the scales' own dtype (bf16), stored as int16; the float factor s.max() / 4096 becomes
               the layer's `input_global_scale`, folded into every token's scale
  matmul       Marlin (csrc/quantization/marlin/marlin_template.h, `matmul_a8`): int8 x (code - 8) products
               summed in int32 per group, each group's sum times its int16 scale added into an int32
               accumulator; at the end float(acc) * a * input_global_scale
So a group scale below max / 8192 becomes 0 (its weights drop out), and the others move to the grid
max / 4096. vLLM fuses q/k/v, gate/up and the GDN in_proj_qkv/in_proj_z into one layer each before
it re-quantizes the scales, so their maximum is shared (`check.rules.PART_OF`). The integer sums are exact here
(float64 holds them exactly); one tensor-parallel rank is simulated (with TP > 1 each rank's
partition has its own maximum). Only the quantization changes numbers: the order of the kernel's
float reductions does not matter at this precision.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from qwenquant.check.activations import SCALE_STEPS  # marlin_act_int8_process_scales' grid: s / s.max() * 4096
from qwenquant.check.rules import PART_OF  # vLLM's packed_modules_mapping (tests/integration/test_fused_map_vllm.py)
from qwenquant.evaluate.reportparts import Int8Linears

log = logging.getLogger(__name__)

INT8_MAX = 127
ABSMAX_FLOOR = 1e-10  # _per_token_quant_int8's floor under a token's absmax
INT32_MAX = 2**31 - 1
CHUNK_BYTES = 256 << 20  # float64 weight rows held at once by int8_act_matmul


def round_half_away(v: torch.Tensor) -> torch.Tensor:
    """Round to the nearest integer, ties away from zero (CUDA's round(), which the Triton kernel calls)."""
    r = torch.round(v)  # ties to even; fix the ties
    t = torch.trunc(v)
    return torch.where((v - t).abs() == 0.5, t + torch.sign(v), r)


def quantize_tokens(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 codes as float32 [M, K], per-token scales float32 [M, 1]) of x [M, K], as vLLM's
    per_token_quant_int8: symmetric, dynamic, a = max(absmax, 1e-10) / 127, codes = round(x * 127 / absmax)."""
    xf = x.float()
    absmax = xf.abs().amax(dim=-1, keepdim=True).clamp_min(ABSMAX_FLOOR)
    return round_half_away(xf * (INT8_MAX / absmax)), absmax / INT8_MAX


def int16_scales(scales: torch.Tensor) -> tuple[torch.Tensor, float]:
    """(int16 scales, float global factor) of one Marlin layer's group scales, as
    marlin_act_int8_process_scales: round(s / s.max() * 4096) computed in the scales' dtype, and s.max() / 4096."""
    top = scales.max()
    s16 = (scales / top * SCALE_STEPS).round().to(torch.int16)
    return s16, float(top.float()) / SCALE_STEPS


def int8_act_matmul(
    x: torch.Tensor, codes: torch.Tensor, s16: torch.Tensor, global_scale: float, group_size: int
) -> tuple[torch.Tensor, int]:
    """(y [..., N] float32, how many outputs overflow int32) for x [..., K], int4 codes [N, K] (signed,
    -8..7), int16 scales [N, K / group_size]: sum_g s16[n, g] * sum_{k in g} q[k] * codes[n, k] in integers,
    then times the token's scale and the global factor."""
    shape = x.shape
    q, a = quantize_tokens(x.reshape(-1, shape[-1]))
    qd, factor = q.double(), a * torch.tensor(global_scale, dtype=torch.float32, device=a.device)
    rows = max(1, CHUNK_BYTES // (8 * codes.shape[1]))  # float64 weights of a 248k-row head are 10 GB: in chunks
    ys, overflow = [], 0
    for r in range(0, codes.shape[0], rows):
        w = codes[r : r + rows].double().unflatten(-1, (-1, group_size)) * s16[r : r + rows].double().unsqueeze(-1)
        acc = qd @ w.flatten(-2).T  # every product and partial sum is an integer below 2^53: exact
        overflow += int((acc.abs() > INT32_MAX).sum())
        ys.append(acc.float() * factor)
    return torch.cat(ys, dim=-1).reshape(*shape[:-1], codes.shape[0]), overflow


class Int8ActLinear(nn.Module):
    """A quantized Linear as Marlin runs it with int8 activations (no bias: Qwen3.5's Linears have none)."""

    codes: torch.Tensor  # buffers registered in __init__
    s16: torch.Tensor

    def __init__(self, codes: torch.Tensor, s16: torch.Tensor, global_scale: float, group_size: int) -> None:
        super().__init__()
        self.register_buffer("codes", codes.to(torch.int8))
        self.register_buffer("s16", s16.to(torch.int16))
        self.global_scale, self.group_size = global_scale, group_size
        self.overflows = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, overflow = int8_act_matmul(x, self.codes, self.s16, self.global_scale, self.group_size)
        self.overflows += overflow
        return y.to(x.dtype)


def fused_name(module: str) -> str:
    """The Marlin layer `module` belongs to in vLLM (check.rules.PART_OF: q/k/v, gate/up, in_proj_qkv/z, in_proj_b/a)."""
    parent, _, leaf = module.rpartition(".")
    return f"{parent}.{PART_OF[leaf]}" if leaf in PART_OF else module


def _codes(packed: dict[str, torch.Tensor], group: dict[str, Any]) -> tuple[torch.Tensor, int]:
    """(signed int codes [N, K], group size) of one pack-quantized module."""
    from qwenquant.modeling.compat import unpack_int32

    w = group.get("weights") or {}
    bits, size = int(w.get("num_bits", 4)), w.get("group_size", 0)
    problems = []
    if bits != 4 or not w.get("symmetric", True) or w.get("strategy") != "group" or not size:
        problems.append(f"num_bits {bits}, symmetric {w.get('symmetric')}, strategy {w.get('strategy')}")
    if "weight_zero_point" in packed:
        problems.append("a stored zero point")
    if problems:
        from qwenquant.errors import CheckError

        raise CheckError(
            f"vLLM's int8-activation path runs symmetric int4 group layers only; this one has {', '.join(problems)}",
            hint="evaluate this artifact without --activations int8",
        )
    shape = torch.Size(int(v) for v in packed["weight_shape"].tolist())
    return unpack_int32(packed["weight_packed"], bits, shape), int(size)


def int8_modules(tensors: dict[str, torch.Tensor], config: dict[str, Any]) -> dict[str, Int8ActLinear]:
    """Every pack-quantized module of `tensors` (normalized names, evaluate/weights.py) as an Int8ActLinear,
    its int16 scales taken relative to the largest scale of the vLLM layer it is fused into."""
    from qwenquant.evaluate.weights import PACK_SUFFIXES, _group_for

    groups = (config.get("quantization_config") or {}).get("config_groups") or {}
    modules = sorted(n[: -len(".weight_packed")] for n in tensors if n.endswith(".weight_packed"))
    tops: dict[str, torch.Tensor] = {}
    for m in modules:
        top = tensors[f"{m}.weight_scale"].max()
        tops[fused_name(m)] = torch.maximum(tops.get(fused_name(m), top), top)
    out = {}
    for m in modules:
        local = {s: tensors[f"{m}.{s}"] for s in PACK_SUFFIXES if f"{m}.{s}" in tensors}
        codes, size = _codes(local, _group_for(m, groups))
        scales, top = local["weight_scale"], tops[fused_name(m)]
        if scales.shape[-1] <= 1:
            raise _one_group(m)
        s16, g = int16_scales(torch.cat([scales.flatten(), top.reshape(1)]))
        out[m] = Int8ActLinear(codes, s16[:-1].reshape(scales.shape), g, size)
    return out


def _one_group(module: str) -> Exception:
    from qwenquant.errors import CheckError

    return CheckError(
        f"{module} has one scale group per row: vLLM 0.32 keeps no input_global_scale for such a "
        "layer and its int8 path fails on it",
        hint="evaluate this artifact without --activations int8",
    )


def swap_linears(root: nn.Module, modules: dict[str, Int8ActLinear], prefix: str = "") -> list[str]:
    """Replace the Linears of `root` named `prefix + name` in `modules` by their Int8ActLinear; the names replaced."""
    done = []
    for name, lin in modules.items():
        if not name.startswith(prefix):
            continue
        path = name[len(prefix) :]
        parent, _, leaf = path.rpartition(".")
        owner = root.get_submodule(parent) if parent else root
        if not isinstance(getattr(owner, leaf, None), nn.Linear):
            continue
        setattr(owner, leaf, lin.to(next(owner.parameters(), lin.codes).device))
        done.append(name)
    return done


def int8_counts(swapped: list[str], lm_head: bool) -> Int8Linears:
    """Which int4 Linears an int8 arm ran with int8 inputs (pure): body and MTP-head modules, the lm_head."""
    mtp = sum(1 for name in swapped if name.startswith("mtp."))
    return Int8Linears(body=len(swapped) - mtp, mtp_head=mtp, lm_head=lm_head)
