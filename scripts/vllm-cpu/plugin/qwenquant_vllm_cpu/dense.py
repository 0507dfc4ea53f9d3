"""Dequantize a compressed-tensors packed int4 Linear to a dense weight (pure torch, no vLLM).

The layout is the one vLLM's CPU W4A16 kernel receives before it repacks: `weight_packed` int32
holding eight 4-bit codes per word along `packed_dim`, `weight_scale` one scale per group of
`group_size` input columns (a whole row when group_size is -1), and for asymmetric schemes
`weight_zero_point` packed the same way along its own `packed_dim`. Symmetric codes are stored
offset by `bias` (compressed-tensors' uint4b8: stored = signed + 8).
"""

from __future__ import annotations

import torch

BITS = 4
PACK = 32 // BITS


def unpack_int4(packed: torch.Tensor, packed_dim: int) -> torch.Tensor:
    """The 4-bit codes (0..15, int32) of an int32 tensor packed along `packed_dim`, lowest nibble first."""
    moved = packed.movedim(packed_dim, -1)
    shifts = torch.arange(0, 32, BITS, dtype=torch.int32, device=packed.device)
    codes = (moved.unsqueeze(-1) >> shifts) & 0xF
    codes = codes.reshape(*moved.shape[:-1], moved.shape[-1] * PACK)
    return codes.movedim(-1, packed_dim)


def dense_weight(
    codes: torch.Tensor,
    scales: torch.Tensor,
    group_size: int,
    dtype: torch.dtype,
    *,
    bias: int = 8,
    zero_points: torch.Tensor | None = None,
) -> torch.Tensor:
    """`(code - offset) * scale` as a [out, in] tensor of `dtype`.

    `codes` [out, in] (0..15), `scales` [out, groups], `zero_points` [out, groups] codes or None
    (then the fixed `bias` is the offset). Computed in float32 and rounded once to `dtype`: every
    product of a code in -15..15 and a bfloat16 scale is exact in float32, so the result equals a
    bfloat16 multiply.
    """
    out_f, in_f = codes.shape
    g = in_f if group_size in (-1, 0) else group_size
    if in_f % g or scales.shape != (out_f, in_f // g):
        raise ValueError(
            f"codes {tuple(codes.shape)} and scales {tuple(scales.shape)} do not match group size {group_size}"
        )
    offset = zero_points.float() if zero_points is not None else torch.tensor(float(bias))
    w = codes.float().reshape(out_f, in_f // g, g)
    w = (w - offset.reshape(out_f, -1, 1) if zero_points is not None else w - offset) * scales.float().reshape(
        out_f, -1, 1
    )
    return w.reshape(out_f, in_f).to(dtype)
