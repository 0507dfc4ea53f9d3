"""Memory of the lm_head stage: the row chunk that fits the GPU, and what stays on the host.

Pure arithmetic; the stage reads the free CUDA memory (stages/lm_head.py `gpu_budget`).

Device working set of one GPTQ row chunk of R rows, D columns, group g, column block B, counted
from `gptq_quantize_rows` / `_gptq_chunk` (head_gptq.py) and per row:
  2 D   the rows as bf16 on the device, before the fp32 conversion (`rows_fp32`)
  4 D   the fp32 working copy the sweep updates in place
  4 D   act-order's permuted copy (`w[:, perm]`; counted always, it is the larger case)
  2 D   int8 codes, and act-order's un-permuted copy (`index_copy_`)
  8 D/g bf16 scales and the amax/amin/float temporaries of `_group_scales`
  16 B  one column block: err1 (fp32), s1 (bf16), s1f (fp32), the rank-1 update temporary (fp32)
  32    loss and the per-column temporaries
Fixed: the Hessian on the device and its Cholesky factor (2 D^2 fp32), the column maps (~32 D).
Packing the same chunk (compressed-tensors' `pack_to_int32`: int32 copies of the codes) needs
less than the sweep per row, and the KL compare reads 32768-row vocabulary chunks of its own.

Host, for the 27B head (V 248320 x D 5120), as `quantize_head` now runs it:
  W bf16, read once from the checkpoint               2.54 GB  (freed before packing)
  GPTQ int8 codes                                     1.27 GB  (freed once packed)
  GPTQ bf16 scales (D/128 per row)                    0.02 GB
  packed int32 codes (written without a bytes copy)   0.64 GB
  RTN: no full-size codes; its rows are quantized where the KL compare reads them (a full set,
  1.27 GB, only with `method: rtn`, where it is the head that ships)
  the held-out hidden states (fp32, N x D), the Hessian (0.1 GB), per-chunk transfers
Peak about 3.9 GB above the process baseline (torch, CUDA context) during the sweep and the
compare (W + GPTQ codes); packing holds the codes and the packed tensor (1.9 GB); writing the
head's shard holds the packed tensor plus one other tensor of that shard at a time. Before, W, the
GPTQ and RTN codes, the packed tensor and a bytes copy of it (6.4 GB) were all held to the end.
On the CPU the compare's 32768-row fp32 chunks (reference, RTN, GPTQ: 3 x 0.67 GB) add to this.
"""

from __future__ import annotations

ROW_CHUNK_CAP = 32768  # past this the sweep is no faster on an H200 (benchmarks/lm_head_bench.py)
CPU_ROW_CHUNK = 8192  # bounds the host working copy; the bytes do not depend on it
SAFETY = 0.8  # of the memory that is free under the cap: the allocator's fragmentation, cuBLAS workspaces
ROW_ALIGN = 1024  # a budget chunk is rounded down to this (tidy GEMM shapes), unless smaller


def gptq_row_bytes(cols: int, group_size: int, block_size: int) -> int:
    """Device bytes one row of a GPTQ row chunk holds at the sweep's peak (the table above)."""
    return cols * (2 + 4 + 4 + 2) + 8 * (cols // group_size) + 16 * min(block_size, cols) + 32


def gptq_fixed_bytes(cols: int) -> int:
    """Device bytes of the sweep that do not grow with the chunk: the Hessian and its factor."""
    return 2 * cols * cols * 4 + 32 * cols


def budget_bytes(free: int, cached: int, cap_left: int | None, *, safety: float = SAFETY) -> int:
    """What the lm_head stage may use on the GPU: free CUDA memory plus what torch's allocator
    holds unused, no more than is left under the process cap (None: no cap), times `safety`."""
    avail = free + cached
    if cap_left is not None:
        avail = min(avail, cap_left)
    return int(max(0, avail) * safety)


def row_chunk_for_budget(
    rows: int, cols: int, budget: int, *, group_size: int = 128, block_size: int = 128, cap: int = ROW_CHUNK_CAP
) -> int:
    """The largest row chunk whose working set fits `budget` bytes, at most `cap` and `rows`, at
    least 1; rounded down to a multiple of ROW_ALIGN when that large."""
    fit = (budget - gptq_fixed_bytes(cols)) // gptq_row_bytes(cols, group_size, block_size)
    n = max(1, min(fit, cap, rows))
    return n - n % ROW_ALIGN if n >= ROW_ALIGN and n < rows else n


def resolve_row_chunk(
    asked: int | str, rows: int, cols: int, budget: int | None, *, group_size: int = 128, block_size: int = 128
) -> int:
    """The row chunk the stage runs: an explicit integer as asked (at most `rows`); "auto" sized
    from the GPU `budget` in bytes, or CPU_ROW_CHUNK when there is no GPU (`budget` None)."""
    if asked != "auto":
        return min(int(asked), rows)
    if budget is None:
        return min(CPU_ROW_CHUNK, rows)
    return row_chunk_for_budget(rows, cols, budget, group_size=group_size, block_size=block_size)
