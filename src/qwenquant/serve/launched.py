"""A server for the length of a with-block, started as `qwenquant serve` starts one.

`qwenquant bench --serve` and `qwenquant eval --serve` both use `launched`: the same preflight
(verify, check, vLLM, context, port, memory, --gpu-mem), the same argv and the same supervisor
(watchdog, readiness probe, log file). The server is stopped and reaped when the block ends, on
an error, and on Ctrl-C (KeyboardInterrupt passes through the block's cleanup).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from qwenquant.net.ports import free_port
from qwenquant.serve.request import ServeRequest

if TYPE_CHECKING:
    from qwenquant.serve.launchplan import LaunchPlan
    from qwenquant.serve.supervisor import Server, ServerSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Launched:
    """A ready server: where it answers, the name it serves, and what was run."""

    url: str
    model: str
    prepared: LaunchPlan
    spec: ServerSpec
    info: dict[str, Any] = field(default_factory=dict)
    server: Server | None = None  # the supervised process (its exit code, fatal log lines, ballast)


def on_free_port(req: ServeRequest) -> ServeRequest:
    """The request on a free port, unless it names one (--port, or `-- --port N`)."""
    return req if req.port is not None or req.extra_port else req.replace(port=free_port())


@contextlib.contextmanager
def launched(req: ServeRequest) -> Iterator[Launched]:
    """Start `req.artifact` under serve's preflight and supervisor, yield it ready, always stop it."""
    from qwenquant.manifest import load_manifest
    from qwenquant.serve.argv import format_command
    from qwenquant.serve.preflight import prepare
    from qwenquant.serve.run import check_served, log_offset, report_prepared, server_spec
    from qwenquant.serve.supervisor import running

    req = on_free_port(req.replace(artifact=req.artifact.resolve()))
    p = prepare(req)
    report_prepared(p, req.label)
    spec = server_spec(p, req)
    command = format_command(p.command, p.env_add, p.env_unset)
    log.info("%sstarting %s", f"{req.label}: " if req.label else "", command)
    info = {
        "artifact": str(req.artifact),
        "artifact_root_digest": load_manifest(req.artifact).root_digest,
        "profile": req.profile_name,
        "gpu_mem": req.gpu_mem,
        "gpu_mem_limit": ("hard" if req.hard_limit else "soft") if req.gpu_mem else None,
        "gpus": req.gpus,
        "split": p.layout.kind if p.layout.gpus > 1 else None,
        "extra_vllm_flags": list(req.extra),
        "device": p.device,
        "activations": p.activations,
        "vllm_version_installed": p.install.version if p.install else None,
        "command": command,
        "server_log": str(spec.log_path),
    }
    offset = log_offset(spec.log_path)
    with running(spec) as server:
        check_served(p, spec.log_path, offset)
        yield Launched(spec.url, p.profile.served_model_name, p, spec, info, server)
