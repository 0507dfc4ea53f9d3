"""One serve request: what `qwenquant serve`, `bench --serve` and `eval --serve` ask a server to be.

Built once where the command line is read, checked when built (one profile, a known device, a
readable --gpu-mem; --gpu-mem-soft only with --gpu-mem and never beside an explicit
--gpu-memory-utilization), then handed down
as it is: the preflight, the supervisor's spec and `launched()` read their settings from it.
Light to import (the CLI reads its defaults): the planning code is imported when a request is built.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from qwenquant.errors import UsageError

DEFAULT_PROFILE = "single-user"  # serve, bench --serve and eval --serve without --profile
DEFAULT_TIMEOUT = 900.0
DEVICES = ("cuda", "cpu")
ACTIVATIONS = ("bf16", "int8")  # --activations: vLLM's Marlin activations (serve/activations.py)


@dataclass(frozen=True)
class ServeRequest:
    """An artifact to serve and how; `extra` holds the vLLM flags given after `--`."""

    artifact: Path
    profile: str | None = None  # None: DEFAULT_PROFILE
    extra: tuple[str, ...] = ()
    port: int | None = None  # None: the profile's
    host: str | None = None  # None: the profile's
    api_key: str | None = None
    served_model_name: str | None = None
    vllm: str | None = None  # None: serve/discover.py's search order
    device: str | None = None  # None: what the vLLM build targets
    timeout: float = DEFAULT_TIMEOUT  # seconds to become ready
    log_file: Path | None = None  # None: serve/preflight.py default_log_path
    gpus: int = 1  # GPUs to split the model over
    split: str | None = None  # tensor | pipeline; None: from the GPUs' link (serve/topology.py)
    gpu_mem: str | None = None  # as given ("24GiB"): the card to behave as
    gpu_mem_soft: bool = False  # --gpu-mem as vLLM's budget only, without the ballast's hard limit
    ballast_reserve: int = 0  # bytes the ballast also leaves free: for the servers a bench run starts after this
    dry_run: bool = False
    public_key: Path | None = None  # serve only: the signature must hold for this key
    signature: Path | None = None  # None: ARTIFACT/model.sig
    label: str = ""  # bench's configuration label, in log lines
    activations: str | None = None  # bf16 | int8; None: the profile's (bf16 unless the recipe opts in)
    host_embeddings: bool | None = None  # --host-embeddings / --no-host-embeddings; None: the profile's

    def __post_init__(self) -> None:
        object.__setattr__(self, "extra", tuple(self.extra))
        if self.device not in (None, *DEVICES):
            raise UsageError(f"unknown --device {self.device!r}", hint="use cuda or cpu")
        if self.gpus < 1:
            raise UsageError(f"--gpus wants a GPU count of 1 or more, got {self.gpus}", hint="e.g. --gpus 2")
        if self.activations not in (None, *ACTIVATIONS):
            raise UsageError(f"unknown --activations {self.activations!r}", hint="use bf16 or int8")
        if self.split not in (None, "tensor", "pipeline"):
            raise UsageError(f"unknown --split {self.split!r}", hint="use tensor or pipeline")
        if self.split and self.gpus == 1:
            raise UsageError(
                f"--split needs --gpus N (--split {self.split} splits the model over several GPUs)",
                hint=f"e.g. --gpus 2 --split {self.split}, or drop --split on one GPU",
            )
        from qwenquant.plan.gpumem import parse_size, refuse_share_conflict

        if self.gpu_mem_soft and not self.gpu_mem:
            raise UsageError("--gpu-mem-soft needs --gpu-mem SIZE", hint="e.g. --gpu-mem 24GiB --gpu-mem-soft")
        refuse_share_conflict(self.gpu_mem, self.extra, self.gpu_mem_soft)
        if self.gpu_mem:
            parse_size(self.gpu_mem)  # a size that cannot be read fails here, before anything runs

    @classmethod
    def from_options(
        cls, artifact: Path, profiles: Sequence[str], extra: Sequence[str] = (), **options: object
    ) -> ServeRequest:
        """The request a command line gives: `profiles` as the repeatable --profile collected them."""
        if len(profiles) > 1:
            raise UsageError(
                f"choose one --profile (got {', '.join(profiles)}: a server runs one profile)",
                hint="e.g. --profile single-user, --profile batch or --profile long-context",
            )
        return cls(Path(artifact), profiles[0] if profiles else None, tuple(extra), **options)  # type: ignore[arg-type]

    @property
    def profile_name(self) -> str:
        return self.profile or DEFAULT_PROFILE

    @property
    def gpu_mem_bytes(self) -> int | None:
        from qwenquant.plan.gpumem import parse_size

        return parse_size(self.gpu_mem) if self.gpu_mem else None

    @property
    def hard_limit(self) -> bool:
        """--gpu-mem is a hard limit (a ballast holds the rest of the GPU) unless --gpu-mem-soft."""
        return bool(self.gpu_mem) and not self.gpu_mem_soft

    @property
    def extra_port(self) -> bool:
        """The vLLM flags after `--` choose the port themselves."""
        return any(a.split("=")[0] == "--port" for a in self.extra)

    def replace(self, **changes: object) -> ServeRequest:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]
