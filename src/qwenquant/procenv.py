"""The environment of every process qwenquant starts (NVLink multicast off unless the user says otherwise),
and the parent-death signal its children set.

NCCL's NVLink SHARP (NVLS), torch symmetric-memory multicast and NVSHMEM's NVLS path all set up
multicast objects across the GPUs of a host; on shared multi-GPU hosts that can take the host's
GPUs out of service, so children (the vLLM server and its tensor-parallel workers, any
torchrun job) get them off. A variable the user already set is left as it is.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Mapping

MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def multicast_off(base: Mapping[str, str]) -> dict[str, str]:
    """The multicast-off variables that `base` does not set already (what a child must add)."""
    return {k: v for k, v in MULTICAST_OFF.items() if k not in base}


def child_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The whole environment for a child process: `base` (default: ours) + multicast off (setdefault)."""
    env = dict(os.environ if base is None else base)
    env.update(multicast_off(env))
    return env


# qwenquant's own import path: a vLLM installed by scripts/install-vllm.sh runs from its own
# environment (.venv-vllm) with its own pins (compressed-tensors, transformers), which a PYTHONPATH set
# for qwenquant would shadow; its launcher says so ("isolated": true).
OWN_PATH_VARS = ("PYTHONPATH", "PYTHONHOME")


def server_env(base: Mapping[str, str] | None = None, *, isolated: bool = True) -> dict[str, str]:
    """The environment of a vLLM server: `base` (default: ours), without qwenquant's import path when
    the server's environment is `isolated` (complete on its own)."""
    env = dict(os.environ if base is None else base)
    if isolated:
        for k in OWN_PATH_VARS:
            env.pop(k, None)
    return env


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def set_parent_death_signal(sig: int) -> bool:
    """Linux: have the kernel send `sig` to this process when its parent *thread* exits.

    The signal follows the thread that forked us, not the process: callers check getppid() before
    acting on it. Returns False where prctl is unavailable (the poll still works there).
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False
