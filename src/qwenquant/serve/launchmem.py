"""The launch's memory (serve/launchplan.py `decide_launch`): the profile under --gpu-mem, the hard limit's
ballast, the budget vLLM is planned against (each GPU checked free enough) and, for a profile's
`kv_cache_from_plan`, vLLM's KV cache set to the plan's figure. Nothing is started; the GPUs are those the machine
read once (serve/machine.py)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from qwenquant.errors import ServeError, UsageError
from qwenquant.plan import budget as budgetmod
from qwenquant.plan.artifact import artifact_budget
from qwenquant.plan.gpumem import apply_gpu_mem, ballast_note
from qwenquant.plan.pipeline import PARTITION_ENV
from qwenquant.plan.report import fill_lines, stage_name
from qwenquant.plan.transient import fill
from qwenquant.plan.weights import model_shape
from qwenquant.recipe import ResolvedProfile
from qwenquant.serve.ballast import ballast_command
from qwenquant.serve.gpus import check_free
from qwenquant.serve.machine import Machine
from qwenquant.serve.request import ServeRequest
from qwenquant.serve.topology import Layout

KV_BYTES_FLAG = "--kv-cache-memory-bytes"


def gpu_mem_profile(
    req: ServeRequest, profile: ResolvedProfile, dev: str, machine: Machine, notes: list[str]
) -> ResolvedProfile:
    """The profile with --gpu-mem applied (plan/gpumem.py `apply_gpu_mem`, over the first GPU's total memory)."""
    return apply_gpu_mem(
        profile,
        req.gpu_mem_bytes,
        dev,
        req.extra,
        lambda: machine.used(1)[0].total,
        notes,
        dry_run=req.dry_run,
        soft=req.gpu_mem_soft,
    )


def ballast(req: ServeRequest, dev: str, n: int, machine: Machine, notes: list[str]) -> tuple[str, ...]:
    """The ballast's argv for a hard --gpu-mem on the `n` GPUs vLLM will use (checked: each has the size free),
    and the line saying what it holds; () without a hard limit."""
    size = req.gpu_mem_bytes
    if not req.hard_limit or size is None or dev != "cuda":
        return ()
    try:
        gpus = machine.used(n)
    except (ServeError, UsageError) as e:
        if not req.dry_run:
            raise
        notes.append(
            f"--gpu-mem {budgetmod.gib(size)} is a hard limit: a ballast process will hold all but that "
            f"of each GPU's free memory (cannot read the GPUs here: {e.message})"
        )
        return tuple(ballast_command(sys.executable, size + req.ballast_reserve, n))
    notes.append(ballast_note(size, [(g.index, g.total, g.free) for g in gpus], req.ballast_reserve))
    return tuple(ballast_command(sys.executable, size + req.ballast_reserve, n, [g.free for g in gpus]))


def kv_cache_from_plan(
    profile: ResolvedProfile, dev: str, budget: budgetmod.Budget | None, extra: Sequence[str], notes: list[str]
) -> list[str]:
    """A profile's `kv_cache_from_plan`: vLLM's KV cache is the plan's figure (--kv-cache-memory-bytes), so vLLM
    skips sizing it from its profiling run, whose activation peak a served request does not reach; a figure
    after -- wins. Only on one CUDA GPU, where the budget is the GPU's."""
    if not profile.kv_cache_from_plan or dev != "cuda" or budget is None or budget.tp * budget.pp > 1:
        return []
    if any(a.split("=", 1)[0] == KV_BYTES_FLAG for a in extra):
        notes.append(f"{KV_BYTES_FLAG} after -- replaces the profile's kv_cache_from_plan")
        return []
    notes.append(
        f"KV cache from the plan: {KV_BYTES_FLAG} {budget.cache_available} ({budgetmod.gib(budget.cache_available)}: "
        "the budget less weights, activations and runtime), not from vLLM's profiling run"
    )
    return [KV_BYTES_FLAG, str(budget.cache_available)]


def _gpu_bytes(machine: Machine, n: int, utilization: float) -> int:
    """Memory per GPU to plan for over the `n` GPUs vLLM uses, each checked free enough for `utilization`."""
    gpus = machine.used(n)
    if n > 1:
        return check_free(gpus, utilization)
    total, free = gpus[0].total, gpus[0].free
    want = int(total * utilization)
    if free < want:
        raise ServeError(
            f"the GPU has {budgetmod.gib(free)} free of {budgetmod.gib(total)}; --gpu-memory-utilization "
            f"{utilization:g} asks for {budgetmod.gib(want)}",
            hint=f"free the GPU or lower --gpu-memory-utilization to {int(free / total * 100) / 100:.2f} "
            "(pass it after --)",
        )
    return total


def budget(
    artifact: Path,
    manifest: Any,
    config: dict[str, Any],
    profile: ResolvedProfile,
    dev: str,
    env_add: dict[str, str],
    machine: Machine,
    layout: Layout,
    warnings: list[str],
) -> budgetmod.Budget:
    """The memory budget of the launch (plan/artifact.py `artifact_budget`) over what each GPU (or, on the CPU,
    VLLM_CPU_KVCACHE_SPACE) gives it; a ServeError when it does not fit, a warning when not every sequence fits
    at once or the context boots but may not fill."""
    if dev == "cuda":
        total = _gpu_bytes(machine, layout.gpus, profile.gpu_memory_utilization)
    else:
        space = env_add.get("VLLM_CPU_KVCACHE_SPACE") or machine.env.get("VLLM_CPU_KVCACHE_SPACE", "1")
        total = int(float(space) * budgetmod.GiB)
    tp, pp = layout.tp, layout.pp
    budget = artifact_budget(
        artifact,
        manifest,
        profile,
        dev,
        total_bytes=total,
        tp=tp if pp == 1 else 1,
        pp=pp,
        partition=machine.env.get(PARTITION_ENV),
    )
    where = f" on {stage_name(budget)}" if pp > 1 else ""
    if not budget.fits:
        raise ServeError(
            f"the memory budget does not fit{where}: " + budget.shortfall_message(),
            hint="`qwenquant plan` shows the whole budget; pass the lowered setting after --",
        )
    if not budget.fits_all_seqs:
        warnings.append(budget.concurrency_message() + where)
    f = fill(budget, model_shape(config))
    if f is not None and not f.holds:
        warnings.append(
            "the context boots but may not fill: " + fill_lines(budget, f)[-1].strip().removeprefix("DOES NOT FILL: ")
        )
    return budget
