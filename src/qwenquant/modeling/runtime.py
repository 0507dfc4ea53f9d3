"""Where torch computes and how reproducibly: the one device resolver and the determinism switches.

`resolve_device` decides for `quantize --device` (the pipeline), the lm_head math (int4.py,
head_quality.py) and anything else that takes a `device=None` meaning "the best one here".
`set_deterministic` is called once per process that quantizes (the gptq and lm_head stages, each
rank of an N-process gptq job): the same inputs give the same bytes on a re-run. On the CPU the
thread count is one of those inputs: torch splits a matmul's or a reduction's sum among its threads,
so another count sums in another order and changes low bits (QWENQUANT_THREADS=1 and =2 build
different artifacts); `thread_fields` puts it in the records of the stages whose bytes depend on it.
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
                raise UsageError(f"--device {name} but no CUDA device is visible",
                                 hint="drop --device, or use --device cpu")
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


def thread_fields(device: str) -> dict[str, str]:
    """Pure but for the environment: what a stage's inputs say about CPU threads. On the CPU the
    thread count decides how float sums are split, so it is an input (`{"threads": "N"}`: another
    count re-runs the stage, and the manifest's stage records name it); on a GPU the CPU threads do
    no arithmetic of the artifact, so nothing (records, manifests and resume stay as they were)."""
    return {"threads": str(cpu_threads())} if device.split(":")[0] == "cpu" else {}


def set_deterministic(seed: int = 0, threads: int | None = None) -> None:
    """Seed everything, fix the thread count, prefer deterministic kernels (same bytes on re-run).
    `threads`: default QWENQUANT_THREADS, else every CPU."""
    import numpy as np
    import torch

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.set_num_threads(threads or cpu_threads())
