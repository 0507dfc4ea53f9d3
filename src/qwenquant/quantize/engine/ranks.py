"""How an N-process gptq job is laid out: pure decisions, no torch.distributed (engine/dist.py
does the communication, engine/launch.py starts the processes).

- `resolve_ranks`: `--gpus N|auto` against `--device` and the CUDA GPUs visible.
- `split_shares`: which calibration samples each rank forwards: contiguous runs of the
  calibration order (llm-compressor's longest-first order), cut where the token counts balance.
  Rank r's Hessian is then the same running sum one process computes over that run, and the
  reduction adds the runs: only the association of the float sum differs from one process.
- `owners`: which rank runs GPTQ on which Linear of a layer: the greedy bin packing llm-compressor's
  distributed GPTQ uses, weighted by an estimate of GPTQ's cost instead of its column count (on the
  27B, down_proj's 17408 columns cost about three times all the 5120-column modules together).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from qwenquant.errors import UsageError

AUTO = "auto"


def parse_gpus(value: str | int | None) -> int | None:
    """`--gpus` as given: a positive count, or None for `auto`. Raises UsageError."""
    if value is None:
        return 1
    text = str(value).strip().lower()
    if text == AUTO:
        return None
    if not text.isdigit() or int(text) < 1:
        raise UsageError(
            f"--gpus must be a positive number or 'auto', got {value!r}",
            hint="pass --gpus 2 for two GPUs, --gpus auto for every visible one",
        )
    return int(text)


def resolve_ranks(requested: int | None, asked_device: str | None, visible_gpus: int) -> int:
    """The number of processes for the gptq stage. `requested` None means auto (every visible
    CUDA GPU); `asked_device` is `--device` as given (None: cuda when present). More than one
    process on the CPU (gloo) only when `--device cpu` asks for it; on CUDA at most one per GPU."""
    if asked_device == "cpu":
        if requested is None:
            raise UsageError(
                "--gpus auto counts CUDA GPUs, and --device cpu uses none",
                hint="give a process count with --device cpu (e.g. --gpus 2), or drop --device cpu",
            )
        return requested
    if requested is None:
        return max(1, visible_gpus)
    if requested > max(1, visible_gpus):
        raise UsageError(
            f"--gpus {requested} but {visible_gpus} CUDA GPU(s) visible",
            hint=f"pass --gpus {max(1, visible_gpus)} (or auto), make more GPUs visible "
            f"(CUDA_VISIBLE_DEVICES), or add --device cpu to run {requested} CPU processes (gloo)",
        )
    return requested


def split_shares(lengths: Sequence[int], ranks: int) -> list[range]:
    """Positions in the calibration order (`lengths` in that order) each rank forwards: `ranks`
    contiguous, non-empty runs, the k-th ending where the running token count first reaches k/ranks
    of the total (so long samples at the front do not all land on rank 0)."""
    n = len(lengths)
    if ranks < 1 or ranks > n:
        raise ValueError(f"{ranks} ranks for {n} calibration samples: every rank needs at least one")
    total = sum(lengths)
    cuts, seen, k = [0], 0, 1
    for pos, t in enumerate(lengths):
        seen += t
        while k < ranks and seen * ranks >= total * k:
            cuts.append(pos + 1)
            k += 1
    cuts += [n] * (ranks + 1 - len(cuts))
    # every run non-empty: push a cut forward (or back from the end) where two coincide
    for k in range(1, ranks):
        cuts[k] = max(cuts[k], cuts[k - 1] + 1)
    for k in range(ranks - 1, 0, -1):
        cuts[k] = min(cuts[k], cuts[k + 1] - 1)
    return [range(cuts[k], cuts[k + 1]) for k in range(ranks)]


def gptq_cost(rows: int, cols: int) -> int:
    """Relative cost of GPTQ on one [rows, cols] weight: the Cholesky inverse (cols^3) plus the
    column sweep with its lazy block updates (rows x cols^2)."""
    return cols**3 + rows * cols**2


def owners(shapes: Mapping[str, tuple[int, int]], ranks: int) -> dict[str, int]:
    """Module name -> the rank that runs its GPTQ (greedy bin packing over `gptq_cost`, ties by
    name, so every rank computes the same assignment)."""
    loads = [0] * ranks
    out: dict[str, int] = {}
    for name in sorted(shapes, key=lambda m: (-gptq_cost(*shapes[m]), m)):
        r = loads.index(min(loads))
        out[name] = r
        loads[r] += gptq_cost(*shapes[name])
    return out
