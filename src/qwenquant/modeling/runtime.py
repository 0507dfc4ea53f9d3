"""Where torch computes and how reproducibly: the one device resolver and the determinism switches.

`resolve_device` decides for `quantize --device` (the pipeline), the lm_head math (int4.py,
head_quality.py) and anything else that takes a `device=None` meaning "the best one here".
`set_deterministic` is called once per process that quantizes (the gptq and lm_head stages, each
rank of an N-process gptq job): the same inputs give the same bytes on a re-run. On the CPU the
thread count is one of those inputs: torch splits a matmul's or a reduction's sum among its threads,
so another count sums in another order and changes low bits (QWENQUANT_THREADS=1 and =2 build
different artifacts); `thread_fields` puts it in the records of the stages whose bytes depend on it.
The count asked for is the count used: `set_deterministic` turns off the OpenMP runtime's dynamic
team sizes, with which (OMP_DYNAMIC=true) the runtime may give a parallel region fewer threads than
asked, by the load on the machine (libgomp: the load average), so other work would change the bytes.
MKL (linked into torch's CPU build: the GPTQ Cholesky and inverse, float32 matmuls, attention's
matmuls) has a dynamic mode of its own (MKL_DYNAMIC, on by default): `torch.set_num_threads` turns
it off, so every MKL call runs on the count asked for (tests/unit/test_runtime.py reads each call's
`Dyn:` and `NThr:` back from MKL_VERBOSE). Outside its conditional numerical reproducibility (CNR)
mode, MKL promises no run-to-run bitwise equality even then: its threaded algorithms may order a sum
by how the threads happen to run (oneMKL developer guide, "Obtaining Numerically Reproducible
Results"). `reproducible_mkl` turns CNR on (MKL_CBWR=AUTO: the CPU's own code path, run to run
reproducible at a fixed thread count) unless MKL_CBWR is set; MKL reads it once, at its first call,
so the CLI sets it before a command computes, and `set_deterministic` for library callers. The mode
is an input like the thread count: `thread_fields` records it.
"""

from __future__ import annotations

import os
import random
from typing import TYPE_CHECKING

from qwenquant import envs
from qwenquant.errors import UsageError

if TYPE_CHECKING:
    import torch


def resolve_device(device: str | torch.device | None = None) -> str:
    """The torch device string to compute on: `device` as given, or (None) cuda when a CUDA device
    is visible, else cpu. Asking for cuda when none is visible is refused up front (UsageError)
    rather than in the first kernel. "cpu" is answered without importing torch."""
    if device is not None:
        name = str(device)
        if name.split(":")[0] == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise UsageError(
                    f"--device {name} but no CUDA device is visible", hint="drop --device, or use --device cpu"
                )
        return name
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def torch_device(device: str | torch.device | None = None) -> torch.device:
    """`resolve_device` as a `torch.device`."""
    import torch

    return torch.device(resolve_device(device))


def cpu_threads() -> int:
    """The CPU threads torch computes with in quantize and eval: QWENQUANT_THREADS, else every CPU
    (`quantize --gpus N` on the CPU gives each rank its share, engine/launch.py)."""
    return envs.get("QWENQUANT_THREADS") or (os.cpu_count() or 1)


MKL_MODE = "AUTO"  # MKL's CNR mode with the code path it picks for this CPU


def reproducible_mkl() -> str:
    """MKL's CNR mode for this process and the children it starts: MKL_CBWR=AUTO unless the
    variable is set (another value is the user's choice, and an input). Effective only before the
    process's first MKL call: MKL reads the variable once. The mode in force, as MKL_CBWR says it."""
    if not os.environ.get("MKL_CBWR"):
        os.environ["MKL_CBWR"] = MKL_MODE
    return os.environ["MKL_CBWR"]


def thread_fields(device: str) -> dict[str, str]:
    """What a stage's inputs say about CPU arithmetic. On the CPU the
    thread count decides how float sums are split, so it is an input (`{"threads": "N"}`: another
    count re-runs the stage, and the manifest's stage records name it), and so is MKL's mode
    (`"mkl_cbwr"`: another mode takes other code paths); on a GPU the CPU threads do no arithmetic
    of the artifact, so nothing (records, manifests and resume stay as they were). Sets MKL's mode
    where unset (`reproducible_mkl`), so the mode recorded is the one the stage computes with."""
    if device.split(":")[0] != "cpu":
        return {}
    return {"threads": str(cpu_threads()), "mkl_cbwr": reproducible_mkl()}


def set_deterministic(seed: int = 0, threads: int | None = None) -> None:
    """Seed everything, fix the thread count, prefer deterministic kernels (same bytes on re-run).
    `threads`: default QWENQUANT_THREADS, else every CPU."""
    import numpy as np
    import torch

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    reproducible_mkl()  # before this process's first MKL call, where a library caller did not make one
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.set_num_threads(threads or cpu_threads())
    fixed_openmp_teams()


def fixed_openmp_teams() -> bool:
    """Turn off dynamic team sizes in the OpenMP runtime torch computes with, for the calling thread
    (the one that computes; `torch.set_num_threads` sets its count the same way, per thread). torch
    turns MKL's dynamic mode off but not OpenMP's: with OMP_DYNAMIC=true in the environment, the
    runtime may give a parallel region fewer threads than asked (libgomp: by the load average), and
    the split of every float sum, hence the bytes, would follow other work on the machine. False when
    no OpenMP runtime is loaded (nothing to turn off)."""
    import ctypes

    for lib in _openmp_runtimes():
        try:
            set_dynamic = ctypes.CDLL(lib).omp_set_dynamic
        except (AttributeError, OSError, TypeError):
            continue
        set_dynamic(0)
        return True
    return False


def _openmp_runtimes() -> list[str | None]:
    """Where omp_set_dynamic may be found: the process's global symbols first, then any OpenMP
    runtime the process has loaded (libgomp, Intel's libiomp5, LLVM's libomp; /proc/self/maps)."""
    found: list[str | None] = [None]
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split()
                if len(fields) < 6:  # an anonymous mapping: no file
                    continue
                path = fields[-1]
                if os.path.basename(path).startswith(("libgomp", "libiomp", "libomp")) and path not in found:
                    found.append(path)
    except OSError:
        pass
    return found
