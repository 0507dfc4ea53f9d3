"""`--gpu-mem`: serve on a big GPU as on a smaller card (a 24 GB card on a 141 GB H200).

vLLM budgets `total x --gpu-memory-utilization` of the GPU for weights, activations and caches
(its "requested memory"). A card of `gpu_mem` bytes at the profile's utilization `u` has the budget
`gpu_mem x u`; on a GPU of `total` bytes the same budget is the share `gpu_mem x u / total`, rounded
down to 6 decimals (under 150 KB on a 141 GB GPU), so `qwenquant plan --gpu-mem` and the server agree.

That budget is soft: vLLM sizes its KV cache to it, but an allocation beyond it (a prefill its
profiling run did not see, CUDA graphs captured late) still succeeds on the bigger GPU. So by
default --gpu-mem is also a hard limit: a ballast process (serve/ballast.py) holds each GPU's
memory beyond `gpu_mem` for the whole life of the server, and vLLM finds `gpu_mem` free as on the
card. `ballast_holds` is that arithmetic; `--gpu-mem-soft` keeps the budget alone (no ballast).

On CPU the option does not apply: vLLM's CPU build sizes only its KV cache, from
VLLM_CPU_KVCACHE_SPACE, and weights and activations live in host memory, so there is no card to
emulate; `serve --gpu-mem` is refused there with a hint naming VLLM_CPU_KVCACHE_SPACE.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from qwenquant.errors import ServeError, UsageError
from qwenquant.plan.budget import gib as _gib
from qwenquant.recipe import ResolvedProfile

_PLACES = 10**6
_UNITS = {
    "": 1,
    "b": 1,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
}


def parse_size(text: str) -> int:
    """'24GiB' / '24GB' / '24' (GiB) -> bytes."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise UsageError(f"--gpu-mem: cannot read the size {text!r}", hint="write it like 24GiB, 24GB or 24 (GiB)")
    unit = m.group(2).lower() or "gib"
    size = int(float(m.group(1)) * _UNITS[unit])
    if size <= 0:
        raise UsageError(f"--gpu-mem: the size {text!r} is not positive", hint="write it like 24GiB, 24GB or 24 (GiB)")
    return size


def utilization_for(gpu_mem: int, gpu_total: int, utilization: float) -> float:
    """vLLM's --gpu-memory-utilization on a `gpu_total`-byte GPU that gives the budget of a
    `gpu_mem`-byte card at `utilization`, rounded down to 6 decimals (never above the card's)."""
    if gpu_mem <= 0 or gpu_total <= 0 or not 0 < utilization <= 1:
        raise ValueError(f"need positive sizes and a utilization in (0, 1], got {gpu_mem}, {gpu_total}, {utilization}")
    if gpu_mem > gpu_total:
        raise ServeError(
            f"--gpu-mem {_gib(gpu_mem)} is more than this GPU's {_gib(gpu_total)}",
            hint="pass a smaller --gpu-mem, or leave it out to use the profile's share of this GPU",
        )
    # round() first: 0.92 x 1 x 1e6 is 919999.9999999999 in floats
    return math.floor(round(gpu_mem * utilization / gpu_total * _PLACES, 6)) / _PLACES


@dataclass(frozen=True)
class CardEmulation:
    """The decided share and a line that says how it was reached."""

    utilization: float
    note: str


def emulate_card(gpu_mem: int, gpu_total: int, utilization: float) -> CardEmulation:
    """The share for `gpu_mem` on this GPU and the line the dry run and the log print."""
    share = utilization_for(gpu_mem, gpu_total, utilization)
    return CardEmulation(
        share,
        (
            f"--gpu-mem {_gib(gpu_mem)}: budget {_gib(int(gpu_mem * utilization))} ({_gib(gpu_mem)} x {utilization:g}) "
            f"= --gpu-memory-utilization {share:g} of this GPU's {_gib(gpu_total)}"
        ),
    )


def explicit_share(extra: Sequence[str]) -> bool:
    """The vLLM flags after `--` set --gpu-memory-utilization themselves."""
    return any(a.split("=", 1)[0] == "--gpu-memory-utilization" for a in extra)


def refuse_share_conflict(gpu_mem: int | str | None, extra: Sequence[str], soft: bool = False) -> None:
    """--gpu-mem-soft beside an explicit --gpu-memory-utilization is a usage error (both only set the
    share). The hard --gpu-mem takes one: the ballast sets the limit and the flag vLLM's share of the
    real GPU, so a share above the card's fails at vLLM's start as it would on the card. Checked
    when a serve request is built, before the preflight, whose dry run would record it as a failed check."""
    if gpu_mem and soft and explicit_share(extra):
        raise UsageError(
            "--gpu-mem-soft and --gpu-memory-utilization both set vLLM's memory share",
            hint="pass one of them (the hard --gpu-mem, without --gpu-mem-soft, takes an explicit share)",
        )


def ballast_holds(gpu_mem: int, gpus: Sequence[tuple[str, int, int]]) -> list[int]:
    """Bytes the ballast will hold on each GPU, given as (index, total, free) bytes: all its free
    memory but `gpu_mem` (its own CUDA context comes out of that); a ServeError naming each GPU with
    less than `gpu_mem` free."""
    short = [f"GPU {i} has {_gib(free)} free of {_gib(total)}" for i, total, free in gpus if free < gpu_mem]
    if short:
        raise ServeError(
            f"{'; '.join(short)}: less than --gpu-mem {_gib(gpu_mem)}, so the hard limit cannot leave "
            "that much to vLLM",
            hint="free the GPU (nvidia-smi lists what uses it), or lower --gpu-mem",
        )
    return [free - gpu_mem for _, _, free in gpus]


def ballast_note(gpu_mem: int, gpus: Sequence[tuple[str, int, int]], reserve: int = 0) -> str:
    """The dry run's and the log's line for the hard limit; `reserve`: bytes also left free for the
    servers a bench run starts after this one (each behind its own ballast)."""
    held = ", ".join(
        f"GPU {i}: {_gib(h)} of {_gib(total)} ({_gib(free)} free now)"
        for (i, total, free), h in zip(gpus, ballast_holds(gpu_mem + reserve, gpus), strict=True)
    )
    later = f" and {_gib(reserve)} for the servers started after it" if reserve else ""
    return (
        f"--gpu-mem {_gib(gpu_mem)} is a hard limit: a ballast process holds all but {_gib(gpu_mem)}{later} of "
        f"the free memory, its own CUDA context included ({held}), from before vLLM starts until after it stops "
        "(--gpu-mem-soft: the budget alone)"
    )


def apply_gpu_mem(
    profile: ResolvedProfile,
    gpu_mem: int | None,
    device: str,
    extra: Sequence[str],
    read_total: Callable[[], int],
    notes: list[str],
    *,
    dry_run: bool = False,
    soft: bool = False,
) -> ResolvedProfile:
    """The profile with the share that emulates a `gpu_mem` card; `read_total` reads this GPU's bytes.

    Refuses --gpu-mem on CPU, and --gpu-mem-soft beside an explicit --gpu-memory-utilization; the
    hard limit keeps an explicit share and says what it asks. In a dry run on a machine whose GPU
    cannot be read, the profile is kept and a note says so.
    """
    if gpu_mem is None:
        return profile
    if device != "cuda":
        raise UsageError(
            "--gpu-mem applies to CUDA GPUs only: vLLM's CPU build sizes its KV cache from "
            "VLLM_CPU_KVCACHE_SPACE, and weights and activations live in host memory",
            hint="drop --gpu-mem; set VLLM_CPU_KVCACHE_SPACE=N (GiB of KV cache) to size the CPU cache",
        )
    refuse_share_conflict(gpu_mem, extra, soft)
    try:
        total = read_total()
    except ServeError as e:
        if not dry_run:
            raise
        notes.append(
            f"--gpu-mem: cannot read this GPU's memory ({e.message}); the command shows the profile's "
            f"--gpu-memory-utilization {profile.gpu_memory_utilization:g}; on a GPU of T bytes it becomes "
            f"{_gib(gpu_mem)} x {profile.gpu_memory_utilization:g} / T"
        )
        return profile
    if explicit_share(extra):
        asks = int(total * profile.gpu_memory_utilization)
        notes.append(
            f"--gpu-mem {_gib(gpu_mem)} with an explicit --gpu-memory-utilization "
            f"{profile.gpu_memory_utilization:g}: vLLM's budget is {_gib(asks)} of this GPU's {_gib(total)}"
            + (
                f", more than the {_gib(gpu_mem)} left to it: vLLM will refuse to start, as on the card"
                if asks > gpu_mem
                else ""
            )
        )
        return profile
    emu = emulate_card(gpu_mem, total, profile.gpu_memory_utilization)
    notes.append(emu.note)
    if soft:
        notes.append(
            "--gpu-mem-soft: no ballast; vLLM sizes its caches to that budget, but an allocation beyond "
            "it still succeeds on this GPU"
        )
    return profile.model_copy(update={"gpu_memory_utilization": emu.utilization})
