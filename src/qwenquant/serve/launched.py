"""A server for the length of a with-block, started as `qwenquant serve` starts one.

`qwenquant bench --serve` and `qwenquant eval --serve` both use `launched`: the same preflight
(verify, check, vLLM, context, port, memory, --gpu-mem), the same argv and the same supervisor
(watchdog, readiness probe, log file). The server is stopped and reaped when the block ends, on
an error, and on Ctrl-C (KeyboardInterrupt passes through the block's cleanup).
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Optional, Sequence

from qwenquant.net.ports import free_port

if TYPE_CHECKING:
    from qwenquant.serve.preflight import Prepared
    from qwenquant.serve.supervisor import ServerSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Launched:
    """A ready server: where it answers, the name it serves, and what was run."""

    url: str
    model: str
    prepared: Prepared
    spec: ServerSpec
    info: dict[str, Any] = field(default_factory=dict)


def prepare_launch(artifact: Path, profile: str, *, gpu_mem: Optional[str], extra: Sequence[str],
                   vllm: Optional[str], device: Optional[str], api_key: Optional[str], label: str = "",
                   gpus: int = 1) -> Prepared:
    """serve's preflight for one server on a free port (unless `-- --port N` is given)."""
    from qwenquant.serve.command import parse_size
    from qwenquant.plan.gpumem import refuse_share_conflict
    from qwenquant.serve.preflight import prepare

    refuse_share_conflict(gpu_mem, list(extra))
    port = None if any(a.split("=")[0] == "--port" for a in extra) else free_port()
    p = prepare(artifact, profile, vllm=vllm, extra=list(extra), port=port, api_key=api_key, device=device,
                gpu_mem=parse_size(gpu_mem) if gpu_mem else None, tp=gpus)
    for w in p.warnings:
        log.warning("%s%s", f"{label}: " if label else "", w)
    return p


@contextlib.contextmanager
def launched(artifact: Path, profile: Optional[str], *, gpu_mem: Optional[str] = None, extra: Sequence[str] = (),
             vllm: Optional[str] = None, device: Optional[str] = None, api_key: Optional[str] = None,
             timeout: float = 900.0, log_file: Optional[Path] = None, label: str = "",
             gpus: int = 1) -> Iterator[Launched]:
    """Start `artifact` under serve's preflight and supervisor, yield it ready, always stop it."""
    from qwenquant.manifest import load_manifest
    from qwenquant.serve.argv import format_command
    from qwenquant.serve.preflight import DEFAULT_PROFILE
    from qwenquant.serve.run import server_spec
    from qwenquant.serve.supervisor import running

    artifact = Path(artifact).resolve()
    profile = profile or DEFAULT_PROFILE  # as `qwenquant serve`
    p = prepare_launch(artifact, profile, gpu_mem=gpu_mem, extra=extra, vllm=vllm, device=device,
                       api_key=api_key, label=label, gpus=gpus)
    spec = server_spec(p, api_key=api_key, log_file=log_file, timeout=timeout)
    command = format_command(p.command, p.env_add)
    log.info("%sstarting %s", f"{label}: " if label else "", command)
    info = {"artifact": str(artifact), "artifact_root_digest": load_manifest(artifact).root_digest,
            "profile": profile, "gpu_mem": gpu_mem, "gpus": gpus, "extra_vllm_flags": list(extra), "device": p.device,
            "vllm_version_installed": p.install.version if p.install else None, "command": command,
            "server_log": str(spec.log_path)}
    with running(spec):
        yield Launched(spec.url, p.profile.served_model_name, p, spec, info)
