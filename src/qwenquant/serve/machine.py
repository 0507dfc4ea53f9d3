"""The machine a launch runs on, read once per command: the GPUs (memory, compute capability) from one
`nvidia-smi --query-gpu`, their link (`nvidia-smi topo`) only when the automatic layout needs it, and the vLLM
CPU build's W4A16 path and fp8 KV cache support from one probe of the vLLM python. `decide_launch` reads the
result and nothing else of the machine; a fact that could not be read is kept as the error that says why, and
raised where a decision needs it (a dry run lists it with the other failures).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from qwenquant.errors import ServeError, UsageError
from qwenquant.serve.gpus import Gpu, gpu_table, used_gpus

if TYPE_CHECKING:
    from qwenquant.serve.cpupath import CpuW4A16Path
    from qwenquant.serve.discover import VllmInstall


@dataclass(frozen=True)
class Machine:
    """What the launch decision knows of this machine (see the module docstring)."""

    env: Mapping[str, str]  # the environment qwenquant runs in
    gpus: tuple[Gpu, ...] = ()  # every GPU nvidia-smi lists
    gpu_problem: ServeError | None = None  # why the GPUs could not be read (None: read, or not asked)
    links: Mapping[tuple[str, str], str] = field(default_factory=dict)  # `nvidia-smi topo -m`, GPU pairs
    p2p: Mapping[tuple[str, str], str] = field(default_factory=dict)  # `nvidia-smi topo -p2p r`
    cpu_path: CpuW4A16Path | None = None  # vLLM's CPU build: its W4A16 path (None: not asked)
    cpu_fp8_kv: bool | None = None  # vLLM's CPU build takes an fp8 KV cache here (None: not asked)
    cpu_problem: ServeError | None = None  # why the CPU build could not be asked

    def used(self, n: int) -> list[Gpu]:
        """The `n` GPUs vLLM will use (CUDA_VISIBLE_DEVICES applied); the reading's error if there was one."""
        if self.gpu_problem is not None:
            raise self.gpu_problem
        return used_gpus(list(self.gpus), n, self.env)

    @property
    def capability(self) -> tuple[int, int] | None:
        """The compute capability of the first GPU vLLM uses, None when it cannot be read."""
        try:
            return self.used(1)[0].capability
        except (ServeError, UsageError):  # no GPU listed, or fewer visible than asked: the budget says which
            return None

    def link(self, n: int) -> tuple[list[str], dict, dict]:
        """(the nvidia-smi indices of the `n` GPUs vLLM uses, the link matrix, the peer-to-peer matrix)."""
        try:
            ids = [g.index for g in self.used(n)]
        except (ServeError, UsageError):  # the budget names the GPUs' problem; here only the link is asked
            ids = [str(i) for i in range(n)]
        return ids, dict(self.links), dict(self.p2p)


def read_machine(device: str, install: VllmInstall | None, env: Mapping[str, str], *, link: bool) -> Machine:
    """Read what a launch on `device` needs, once: the GPUs on CUDA (and their link when `link`), the vLLM CPU
    build's answers on CPU."""
    if device == "cuda":
        return _read_gpus(env, link)
    if install is None or not install.python:
        return Machine(env)
    from qwenquant.serve.cpupath import cpu_fp8_kv_cache, cpu_w4a16_path

    try:
        return Machine(
            env,
            cpu_path=cpu_w4a16_path(install.python, isolated=install.isolated),
            cpu_fp8_kv=cpu_fp8_kv_cache(install.python, isolated=install.isolated),
        )
    except ServeError as e:
        return Machine(env, cpu_problem=e)


def _read_gpus(env: Mapping[str, str], link: bool) -> Machine:
    from qwenquant.serve.topology import read_topology

    try:
        gpus, problem = tuple(gpu_table()), None
    except ServeError as e:
        gpus, problem = (), e
    links, p2p = read_topology() if link and problem is None else ({}, {})
    return Machine(env, gpus, problem, links, p2p)
