"""Activation-calibrated int4 lm_head: Hessian, row-chunked GPTQ, RTN, packing, config group.

Pure tensor functions; the pipeline owns files. The math follows llm-compressor 0.14's
`modifiers/gptq/gptq_quantize.py` (same damping, dead-column and RTN-fallback rules, same
quantize/dequantize rounding), but the Hessian is shared by all rows, so its Cholesky factor
is computed once and the column sweep runs on `row_chunk` rows at a time: the working copy is
O(row_chunk * D) instead of the whole 248320 x 5120 head in fp32.

Conventions (compressed-tensors 0.19, symmetric int group quantization, checked in tests):
  scale = max(|min(w_g)|, |max(w_g)|) / ((qmax - qmin) / 2) = absmax / 7.5 for int4, stored
  bf16, a zero scale replaced by finfo(bf16).eps; q = round(clamp(w / scale, -8, 7));
  dequant = q.to(bf16) * scale (bf16); no zero point is stored for symmetric weights.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from qwenquant.checkpoint.names import LM_HEAD_TARGET
from qwenquant.modeling import compat
from qwenquant.modeling.head_quality import (
    StopForward,
    capture_final_hidden,
    compare_heads,
    head_quality,
)
from qwenquant.modeling.int4 import (
    SCALE_DTYPE,
    QuantizedHead,
    RtnHead,
    _check_shapes,
    _group_scales,
    _row_chunks,
    int_range,
    rows_fp32,
    rtn_quantize_rows,
)
from qwenquant.modeling.runtime import torch_device

if TYPE_CHECKING:
    from qwenquant.recipe import LmHeadSpec

log = logging.getLogger(__name__)

Progress = Callable[[int, int], None]

__all__ = [
    "HeadQuantSpec",
    "HeadResult",
    "QuantizedHead",
    "RtnHead",
    "StopForward",
    "accumulate_hessian",
    "capture_final_hidden",
    "compare_heads",
    "gptq_quantize_rows",
    "head_config_group",
    "head_quality",
    "pack_head",
    "quantize_head",
    "rtn_quantize_rows",
]


@dataclass(frozen=True)
class HeadQuantSpec:
    """What the head is quantized to; any object with these attributes is accepted."""

    num_bits: int = 4
    group_size: int = 128
    symmetric: bool = True
    actorder: bool = False


@torch.no_grad()
def accumulate_hessian(
    H: torch.Tensor | None, hidden: torch.Tensor, n_seen: int, *, precision: str = "fp32"
) -> tuple[torch.Tensor, int]:
    """Fold a batch of lm_head inputs [..., D] into the running H = 2/N * X^T X (fp32).

    H lives on the device of the first batch; rows are tokens (N counts tokens, not sequences:
    the scale of H does not change GPTQ's result). `precision` "tensor-core" multiplies bf16/fp16
    inputs as they are with float32 output (`compat.gram`); "fp32" multiplies float32 copies.
    """
    x = hidden.reshape(-1, hidden.shape[-1])
    m = x.shape[0]
    if H is None:
        H = torch.zeros((x.shape[1], x.shape[1]), dtype=torch.float32, device=x.device)
    if m == 0:
        return H, n_seen
    if H.shape != (x.shape[1], x.shape[1]):
        raise ValueError(f"hidden width {x.shape[1]} does not match Hessian {tuple(H.shape)}")
    total = n_seen + m
    H.mul_(n_seen / total)
    if precision == "tensor-core" and x.dtype in (torch.bfloat16, torch.float16):
        H.add_(compat.gram(x.to(device=H.device), precision), alpha=2.0 / total)
        return H, total
    x = x.to(device=H.device, dtype=torch.float32)
    H.addmm_(x.t(), x, alpha=2.0 / total)
    return H, total


def _factorize(H: torch.Tensor, dampening_frac: float, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """Upper Cholesky factor of the damped H^-1, dead-column mask, and the RTN-fallback flag."""
    H = H.to(device=dev, dtype=torch.float32, copy=True)
    diag = torch.diagonal(H)
    dead = diag == 0
    diag.masked_fill_(dead, 1.0)
    diag.add_(dampening_frac * diag.mean())
    # in place, the same calls as llm-compressor's factorize_hessian: one D x D buffer
    info = torch.empty((), dtype=torch.int32, device=dev)
    torch.linalg.cholesky_ex(H, check_errors=False, out=(H, info))
    if int(info) != 0:
        # llm-compressor falls back to RTN (identity factor) when H is not positive definite
        log.warning("lm_head Hessian is not positive definite; falling back to round-to-nearest")
        return torch.eye(H.shape[0], device=dev), dead, True
    torch.cholesky_inverse(H, out=H)
    torch.linalg.cholesky(H, upper=True, out=H)
    return H, dead, False


def _gptq_chunk(
    w: torch.Tensor,
    Hinv: torch.Tensor,
    scale: torch.Tensor,
    col_group: torch.Tensor,
    qmin: int,
    qmax: int,
    block_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Column-blocked GPTQ sweep (Frantar et al. 2022, sec. 3.4) over one fp32 row chunk, in place.

    `col_group[j]` is the scale column of working column j; returns int8 codes in working
    column order and the per-row loss.
    """
    rows, cols = w.shape
    ints = torch.empty((rows, cols), dtype=torch.int8, device=w.device)
    loss = torch.zeros(rows, dtype=torch.float32, device=w.device)
    for i1 in range(0, cols, block_size):
        i2 = min(i1 + block_size, cols)
        w1 = w[:, i1:i2]
        err1 = torch.empty_like(w1)
        h1 = Hinv[i1:i2, i1:i2]
        s1 = scale[:, col_group[i1:i2]]
        s1f = s1.float()
        for i in range(i2 - i1):
            col = w1[:, i]
            q = torch.round(torch.clamp(col / s1f[:, i], qmin, qmax))
            # dequantize in the scale dtype, as llm-compressor's fake_quantize and vLLM do
            deq = (q.to(s1.dtype) * s1[:, i]).float()
            e = (col - deq) / h1[i, i]
            ints[:, i1 + i] = q.to(torch.int8)
            err1[:, i] = e
            w1[:, i:].sub_(e.unsqueeze(1) * h1[i, i:].unsqueeze(0))
        loss += err1.square().sum(dim=1) / 2
        if i2 < cols:
            w[:, i2:].addmm_(err1, Hinv[i1:i2, i2:], alpha=-1.0)
    return ints, loss


@torch.no_grad()
def _actorder(H: torch.Tensor, actorder: bool) -> tuple[torch.Tensor | None, torch.Tensor]:
    """actorder's column permutation (descending H_ii, on H's device; None without actorder) and the Hessian in
    that order."""
    if not actorder:
        return None, H
    perm = torch.argsort(torch.diagonal(H), descending=True).to(H.device)
    return perm, H[perm][:, perm]


def gptq_quantize_rows(
    W: torch.Tensor,
    H: torch.Tensor,
    *,
    num_bits: int = 4,
    group_size: int = 128,
    symmetric: bool = True,
    dampening_frac: float = 0.01,
    block_size: int = 128,
    row_chunk: int | None = 8192,
    actorder: bool = False,
    device: str | torch.device | None = None,
    progress: Progress | None = None,
) -> QuantizedHead:
    """GPTQ a [V, D] head against one shared Hessian [D, D], `row_chunk` rows at a time.

    Scales are static minmax group scales of the original weights (as llm-compressor's weight
    observer). Dead columns (H_ii == 0) are zeroed and their diagonal set to 1 before damping.
    `actorder=True` sweeps columns by descending H_ii (llm-compressor's "static"/"weight"
    order); groups keep their original columns, so the checkpoint format is unchanged.
    `row_chunk` None or <= 0 means all rows at once. Results return on the CPU.
    """
    _check_shapes(W, num_bits, group_size, symmetric)
    if H.shape != (W.shape[1], W.shape[1]):
        raise ValueError(f"Hessian shape {tuple(H.shape)} does not match weight {tuple(W.shape)}")
    dev = torch_device(device)
    qmin, qmax = int_range(num_bits)
    cols = W.shape[1]

    perm, H_work = _actorder(H, actorder)
    Hinv, dead, fallback = _factorize(H_work, dampening_frac, dev)
    col_group = torch.arange(cols, device=dev) // group_size
    if perm is not None:
        perm = perm.to(dev)
        col_group = col_group[perm]

    ints = torch.empty(W.shape, dtype=torch.int8)
    scales = torch.empty((W.shape[0], cols // group_size), dtype=SCALE_DTYPE)
    total_loss = 0.0
    chunks = _row_chunks(W.shape[0], row_chunk)
    for k, (r0, r1) in enumerate(chunks):
        # a fresh copy: the sweep works in place and must never touch the caller's tensor
        w = rows_fp32(W, r0, r1, dev)
        s = _group_scales(w, num_bits, group_size)
        if perm is not None:
            w = w[:, perm]
        w.masked_fill_(dead.unsqueeze(0), 0.0)
        q, loss = _gptq_chunk(w, Hinv, s, col_group, qmin, qmax, block_size)
        del w
        if perm is not None:
            q = torch.empty_like(q).index_copy_(1, perm, q)
        ints[r0:r1] = q.cpu()
        scales[r0:r1] = s.cpu()
        total_loss += float(loss.sum())
        if progress is not None:
            progress(k + 1, len(chunks))
    return QuantizedHead(ints, scales, num_bits, group_size, method="gptq", used_rtn_fallback=fallback, loss=total_loss)


def pack_head(
    q: QuantizedHead, prefix: str = "lm_head", *, row_chunk: int = 16384, device: str | torch.device | None = None
) -> dict[str, torch.Tensor]:
    """Checkpoint tensors in compressed-tensors' pack-quantized layout (symmetric: no zero point).

    `weight_shape` is int64, as compressed-tensors itself writes it (`torch.tensor(weight.shape)`).
    Packing is row by row, so it runs `row_chunk` rows at a time on `device` (the GPU when there is
    one): compressed-tensors' packer makes several int32 copies of what it packs, 4x the codes each,
    which for the whole 248320 x 5120 head were about 15 GB of host memory. Same bytes either way.
    """
    from qwenquant.modeling.compat import pack_int32

    dev = torch_device(device)
    packed: torch.Tensor | None = None
    for r0, r1 in _row_chunks(q.int.shape[0], row_chunk):
        part = pack_int32(q.int[r0:r1].to(dev).contiguous(), q.num_bits).cpu()
        if packed is None:
            packed = torch.empty((q.int.shape[0], part.shape[1]), dtype=part.dtype)
        packed[r0:r1] = part
    assert packed is not None
    return {
        f"{prefix}.weight_packed": packed,
        f"{prefix}.weight_scale": q.scale.contiguous(),
        f"{prefix}.weight_shape": torch.tensor(q.shape, dtype=torch.int64),
    }


def head_config_group(spec: HeadQuantSpec | LmHeadSpec | Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The compressed-tensors config group for the head, keyed as llm-compressor 0.14 writes it.

    `spec`: a HeadQuantSpec, a mapping of its fields, or any object with num_bits, group_size,
    symmetric (and optionally actorder) attributes; None means W4A16 g128.
    The `re:.*lm_head$` target matches both `lm_head` and vLLM's `language_model.lm_head`.
    """
    from qwenquant.modeling.compat import weight_scheme

    if spec is None:
        spec = HeadQuantSpec()
    elif isinstance(spec, Mapping):
        spec = HeadQuantSpec(**spec)
    target = getattr(spec, "target", None) or LM_HEAD_TARGET
    # actorder: what the sweep did; "static" (= "weight") changes calibration only, not the format
    return weight_scheme(
        [target],
        num_bits=spec.num_bits,
        symmetric=spec.symmetric,
        group_size=spec.group_size,
        actorder="static" if getattr(spec, "actorder", False) else None,
        observer="memoryless_minmax",
    )


@dataclass
class HeadResult:
    """What `quantize_head` returns: the checkpoint tensors, the compare, and how it went."""

    tensors: dict[str, torch.Tensor]
    report: dict[str, Any] | None  # compare_heads' figures; None without held-out states
    used_rtn_fallback: bool
    seconds: dict[str, float]  # gptq, rtn, compare, pack


@contextmanager
def _clock(seconds: dict[str, float], part: str, dev: torch.device) -> Iterator[None]:
    """Add the wall time of the block (the device synchronized at its end) to seconds[part]."""
    t0 = time.perf_counter()
    yield
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    seconds[part] = seconds.get(part, 0.0) + time.perf_counter() - t0


def quantize_head(
    read_weight: Callable[[], torch.Tensor],
    H: torch.Tensor,
    heldout: torch.Tensor | None,
    spec: Any,
    *,
    row_chunk: int,
    prefix: str = "lm_head",
    device: str | torch.device | None = None,
    progress: Progress | None = None,
    gate: Callable[[dict[str, Any]], None] | None = None,
) -> HeadResult:
    """The lm_head stage's tensor work: GPTQ, the KL compare against RTN, packing (memory: head_memory.py).

    `read_weight()` returns the [V, D] head; this function holds the only reference, so the head
    is freed before packing. `spec` has method, num_bits, group_size, symmetric, dampening_frac,
    block_size (an LmHeadSpec). RTN rows are quantized where the compare reads them (`RtnHead`);
    a full RTN head is made only when it is the one that ships (`method: rtn`). `gate(report)`
    may raise before anything is packed. Same bytes as quantizing, comparing and packing whole heads.
    """
    dev = torch_device(device)
    seconds: dict[str, float] = {}
    W = read_weight()
    common = dict(num_bits=spec.num_bits, group_size=spec.group_size, symmetric=spec.symmetric, device=dev)
    with _clock(seconds, "gptq", dev):
        q_gptq = gptq_quantize_rows(
            W,
            H.to(dev),
            dampening_frac=spec.dampening_frac,
            block_size=spec.block_size,
            row_chunk=row_chunk,
            progress=progress,
            **common,
        )
    rtn = RtnHead(W, spec.num_bits, spec.group_size, dev, symmetric=spec.symmetric)
    report = None
    if heldout is not None:
        with _clock(seconds, "compare", dev):
            report = compare_heads(W, rtn, q_gptq, heldout, device=dev)
        seconds["compare"] -= rtn.seconds  # the RTN rows quantized inside the compare
    seconds["rtn"] = rtn.seconds
    if report is not None and gate is not None:
        gate(report)
    chosen = q_gptq
    if spec.method == "rtn":
        with _clock(seconds, "rtn", dev):
            chosen = rtn_quantize_rows(W, row_chunk=row_chunk, **common)
    del W, rtn
    with _clock(seconds, "pack", dev):
        tensors = pack_head(chosen, prefix, row_chunk=row_chunk, device=dev)
    return HeadResult(tensors, report, q_gptq.used_rtn_fallback, seconds)
