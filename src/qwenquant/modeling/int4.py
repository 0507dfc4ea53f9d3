"""Symmetric int group quantization of a weight matrix as compressed-tensors 0.19 stores it:
scales, round-to-nearest codes, dequantization (pure tensor functions).

  scale = max(|min(w_g)|, |max(w_g)|) / ((qmax - qmin) / 2) = absmax / 7.5 for int4, stored
  bf16, a zero scale replaced by finfo(bf16).eps; q = round(clamp(w / scale, -8, 7));
  dequant = q.to(bf16) * scale (bf16); no zero point is stored for symmetric weights.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable
from dataclasses import dataclass

import torch

from qwenquant.errors import StageError
from qwenquant.modeling.runtime import torch_device

Progress = Callable[[int, int], None]

SCALE_DTYPE = torch.bfloat16


@dataclass
class QuantizedHead:
    """Integer codes [V, D] (int8, in [qmin, qmax]) and bf16 group scales [V, D / group_size]."""

    int: torch.Tensor  # the field shadows the builtin in this class body: annotations below say builtins.int
    scale: torch.Tensor
    num_bits: builtins.int
    group_size: builtins.int
    method: str = "gptq"
    used_rtn_fallback: bool = False
    loss: float | None = None

    @property
    def shape(self) -> tuple[builtins.int, builtins.int]:
        return (int(self.int.shape[0]), int(self.int.shape[1]))

    def dequantize(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """q.to(scale dtype) * scale per group, the same ops as compressed-tensors' dequantize."""
        rows, cols = self.shape
        q = self.int.unflatten(-1, (cols // self.group_size, self.group_size))
        w = (q.to(self.scale.dtype) * self.scale.unsqueeze(-1)).flatten(-2)
        return w if dtype is None else w.to(dtype)


def int_range(num_bits: int) -> tuple[int, int]:
    """Signed integer range compressed-tensors uses: [-2^(b-1), 2^(b-1) - 1]."""
    return -(1 << (num_bits - 1)), (1 << (num_bits - 1)) - 1


def _check_shapes(W: torch.Tensor, num_bits: int, group_size: int, symmetric: bool) -> None:
    if W.ndim != 2:
        raise ValueError(f"expected a 2-D head weight, got shape {tuple(W.shape)}")
    problems = []
    if not symmetric:
        problems.append("lm_head quantization supports symmetric=true only (no zero points)")
    if not 2 <= num_bits <= 8:
        problems.append(f"num_bits must be in 2..8 for pack-quantized, got {num_bits}")
    if group_size <= 0 or W.shape[1] % group_size:
        problems.append(f"group_size must divide the hidden size {W.shape[1]}, got {group_size}")
    if problems:
        raise StageError(
            "cannot quantize lm_head: " + "; ".join(problems),
            hint="fix the lm_head section of the recipe (W4A16: num_bits 4, group_size 128, symmetric)",
        )


def _group_scales(w: torch.Tensor, num_bits: int, group_size: int) -> torch.Tensor:
    """Symmetric minmax scales [rows, D/g] in bf16, as compressed-tensors' calculate_qparams."""
    qmin, qmax = int_range(num_bits)
    g = w.unflatten(-1, (-1, group_size))
    # max(|min|, |max|) per group without an |w| temporary as large as the chunk
    absmax = torch.maximum(g.amax(dim=-1).abs(), g.amin(dim=-1).abs()).float()
    scale = (absmax / ((qmax - qmin) / 2)).to(SCALE_DTYPE)
    return scale.masked_fill(scale == 0, torch.finfo(SCALE_DTYPE).eps)


def _row_chunks(rows: int, row_chunk: int | None) -> list[tuple[int, int]]:
    step = rows if not row_chunk or row_chunk <= 0 else min(row_chunk, rows)
    return [(r0, min(r0 + step, rows)) for r0 in range(0, rows, step)]


def rtn_codes(w: torch.Tensor, num_bits: int, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Round-to-nearest of fp32 rows on their own device: (int8 codes, bf16 group scales).

    Every row is computed on its own (elementwise and per group), so any row slicing gives the
    same codes."""
    qmin, qmax = int_range(num_bits)
    s = _group_scales(w, num_bits, group_size)
    q = (w.unflatten(-1, (-1, group_size)) / s.float().unsqueeze(-1)).clamp_(qmin, qmax).round_()
    return q.flatten(-2).to(torch.int8), s


def rows_fp32(W: torch.Tensor, r0: int, r1: int, device: torch.device) -> torch.Tensor:
    """Rows r0:r1 of W as a fresh fp32 tensor on `device`, converted there: a CPU bf16 head
    crosses to the GPU as bf16 (half the bytes) and no fp32 copy of the rows is made on the host."""
    return W[r0:r1].to(device).to(torch.float32, copy=True)


@torch.no_grad()
def rtn_quantize_rows(
    W: torch.Tensor,
    *,
    num_bits: int = 4,
    group_size: int = 128,
    symmetric: bool = True,
    row_chunk: int = 8192,
    device: str | torch.device | None = None,
    progress: Progress | None = None,
) -> QuantizedHead:
    """Round-to-nearest with the same scales and rounding as GPTQ: the baseline."""
    _check_shapes(W, num_bits, group_size, symmetric)
    dev = torch_device(device)
    ints = torch.empty(W.shape, dtype=torch.int8)
    scales = torch.empty((W.shape[0], W.shape[1] // group_size), dtype=SCALE_DTYPE)
    chunks = _row_chunks(W.shape[0], row_chunk)
    for k, (r0, r1) in enumerate(chunks):
        q, s = rtn_codes(rows_fp32(W, r0, r1, dev), num_bits, group_size)
        ints[r0:r1] = q.cpu()
        scales[r0:r1] = s.cpu()
        if progress is not None:
            progress(k + 1, len(chunks))
    return QuantizedHead(ints, scales, num_bits, group_size, method="rtn")


class RtnHead:
    """The round-to-nearest head of W, quantized and dequantized a row slice at a time on `device`
    when a slice is read (`head[v0:v1]`, bf16 rows as `QuantizedHead.dequantize` gives them): the
    KL compare's baseline without a second full-size set of int8 codes on the host.

    `seconds` adds up the time spent in those reads (synchronized on CUDA), for benchmarks."""

    def __init__(
        self,
        W: torch.Tensor,
        num_bits: int,
        group_size: int,
        device: str | torch.device | None = None,
        *,
        symmetric: bool = True,
    ) -> None:
        _check_shapes(W, num_bits, group_size, symmetric)
        self.W, self.num_bits, self.group_size = W, num_bits, group_size
        self.device = torch_device(device)
        self.shape = (int(W.shape[0]), int(W.shape[1]))
        self.seconds = 0.0

    @torch.no_grad()
    def __getitem__(self, rows: slice) -> torch.Tensor:
        import time

        t0 = time.perf_counter()
        r0, r1, _ = rows.indices(self.shape[0])
        q, s = rtn_codes(rows_fp32(self.W, r0, r1, self.device), self.num_bits, self.group_size)
        out = QuantizedHead(q, s, self.num_bits, self.group_size, method="rtn").dequantize()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.seconds += time.perf_counter() - t0
        return out
