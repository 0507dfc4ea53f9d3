"""The collective steps of an N-process gptq job, inside one rank (torch.distributed).

Per decoder layer (engine/run.py drives it):
  every rank forwards its share of the calibration samples with llm-compressor's Hessian hooks ->
  `reduce_hessians`: each module's un-normalised Hessian sum and sample count are summed onto the
  module's owner rank (engine/ranks.owners), as llm-compressor's distributed GPTQ does -> each
  owner runs GPTQ on its modules and packs them -> `gather_packed`: the packed tensors go to rank 0,
  which persists the layer and its record -> `barrier` -> every rank rebuilds the layer from the
  persisted file and forwards its share again (the next layer's inputs).
After the last layer `combine_head` sums the lm_head Hessians (weighted by token counts, exactly as
one running mean would weight them) and gathers the held-out hidden states onto rank 0.

Rank 0 does every file write; the other ranks only read. nccl on CUDA (rank r on cuda:r), gloo on
the CPU. llm-compressor 0.14's `accumulate_hessian` (through modeling/compat.py) keeps an
un-normalised sum and a count (`prepare_batch` divides), so summing both over ranks is the
one-process combination; only the association of the float additions differs.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from qwenquant import envs

log = logging.getLogger(__name__)

# A collective waits this long for the slowest rank (a 27B layer takes ~10 s; rank 0's writes more).
TIMEOUT = timedelta(minutes=envs.get("QWENQUANT_DIST_TIMEOUT_MIN"))


@dataclass(frozen=True)
class Ranks:
    """This process's place in the job."""

    rank: int
    world: int

    @property
    def main(self) -> bool:
        return self.rank == 0


def init(device: str) -> Ranks:
    """Join the job the launcher started (env:// rendezvous: RANK, WORLD_SIZE, MASTER_ADDR/PORT)."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    kwargs: dict[str, Any] = (
        {"device_id": torch.device("cuda", torch.cuda.current_device())} if device == "cuda" else {}
    )
    dist.init_process_group(
        "nccl" if device == "cuda" else "gloo", rank=rank, world_size=world, timeout=TIMEOUT, **kwargs
    )
    return Ranks(rank, world)


def barrier() -> None:
    dist.barrier()


def broadcast_int(value: int, device: str) -> int:
    """Rank 0's `value` on every rank."""
    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.broadcast(t, src=0)
    return int(t.item())


def reduce_hessians(gptq: Any, owner: dict[str, int], ranks: Ranks) -> None:
    """Sum every module's Hessian and sample count onto its owner; other ranks drop theirs.
    `gptq`: engine.quantize.LayerGPTQ after the calibration forward (hooks done)."""
    from qwenquant.modeling import compat

    gptq.unshare()  # a reduction is in place: each module needs its own tensor
    pending = []
    for name, mod in gptq.modules.items():  # the same order on every rank
        if mod not in gptq.counts:  # no sample of this rank reached it: add nothing, still take part
            gptq.hessians[mod] = compat.empty_hessian(mod)
            gptq.counts[mod] = torch.zeros((), device=mod.weight.device)
        pending.append(dist.reduce(gptq.hessians[mod], dst=owner[name], op=dist.ReduceOp.SUM, async_op=True))
        pending.append(dist.reduce(gptq.counts[mod], dst=owner[name], op=dist.ReduceOp.SUM, async_op=True))
    for w in pending:
        w.wait()
    for name, mod in gptq.modules.items():
        if owner[name] != ranks.rank:
            del gptq.hessians[mod], gptq.counts[mod]


def gather_packed(
    packed: dict[str, dict[str, torch.Tensor]], ranks: Ranks
) -> dict[str, dict[str, torch.Tensor]] | None:
    """Every owner's packed modules (CPU tensors) on rank 0; None elsewhere."""
    parts: list[Any] | None = [None] * ranks.world if ranks.main else None
    dist.gather_object(packed, parts, dst=0)
    if not ranks.main:
        return None
    out: dict[str, dict[str, torch.Tensor]] = {}
    for p in parts or []:
        out.update(p)
    return out


def combine_head(
    H: torch.Tensor | None, tokens: int, held: dict[int, torch.Tensor], width: int, device: str, ranks: Ranks
) -> tuple[torch.Tensor | None, int, list[torch.Tensor]] | None:
    """On rank 0: (the lm_head Hessian over every rank's calibration tokens, the token count, the
    held-out hidden states in sample order); None elsewhere. Each rank's H is a running mean over its
    `tokens` tokens (quantize.head_gptq.accumulate_hessian), so the sum is sum(H_r * n_r) / sum(n_r)."""
    total = torch.tensor([tokens], dtype=torch.int64, device=device)
    dist.all_reduce(total)
    n = int(total.item())
    acc = (H * tokens) if H is not None else torch.zeros((width, width), dtype=torch.float32, device=device)
    dist.reduce(acc, dst=0, op=dist.ReduceOp.SUM)
    parts: list[Any] | None = [None] * ranks.world if ranks.main else None
    dist.gather_object({j: h.cpu() for j, h in held.items()}, parts, dst=0)
    if not ranks.main:
        return None
    merged: dict[int, torch.Tensor] = {}
    for p in parts or []:
        merged.update(p)
    return (acc / n if n else None), n, [merged[j] for j in sorted(merged)]


def gather_metrics(own: dict[str, Any], ranks: Ranks) -> list[dict[str, Any]] | None:
    """Every rank's `own` figures on rank 0 (for benchmarks); None elsewhere."""
    parts: list[Any] | None = [None] * ranks.world if ranks.main else None
    dist.gather_object(own, parts, dst=0)
    return list(parts or []) if ranks.main else None
