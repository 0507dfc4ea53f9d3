"""The body of `qwenquant serve`: preflight, then dry-run output or the supervised server."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Optional

from qwenquant.errors import QwenquantError, UsageError
from qwenquant.serve.argv import format_command
from qwenquant.plan.gpumem import refuse_share_conflict
from qwenquant.serve.preflight import DEFAULT_PROFILE, Prepared, default_log_path, prepare
from qwenquant.serve.supervisor import ServerSpec, serve_forever

log = logging.getLogger(__name__)


def server_spec(p: Prepared, *, api_key: Optional[str], log_file: Optional[Path], timeout: float) -> ServerSpec:
    """What the supervisor runs for a prepared launch (also used by `qwenquant bench --serve`)."""
    return ServerSpec(
        command=p.command, env={**os.environ, **p.env_add}, host=p.profile.host, port=p.profile.port,
        served_model_name=p.profile.served_model_name, artifact_root=str(p.artifact), api_key=api_key,
        log_path=log_file or default_log_path(p.artifact), timeout=timeout,
    )


def run_serve(artifact: Path, profiles: list[str], extra: list[str], *, port: Optional[int], host: Optional[str],
              api_key: Optional[str], served_model_name: Optional[str], vllm: Optional[str], dry_run: bool,
              timeout: float, device: Optional[str], log_file: Optional[Path], gpu_mem: Optional[str] = None,
              tp: int = 1) -> int:
    """Serve until stopped; return the exit code (errors raise UsageError, ServeError, VerificationError)."""
    profiles = profiles or [DEFAULT_PROFILE]
    if len(profiles) != 1:
        raise UsageError(f"choose one --profile (got {', '.join(profiles)}: single-user and batch are mutually exclusive)",
                         hint="e.g. --profile single-user, or --profile batch")
    if device not in (None, "cuda", "cpu"):
        raise UsageError(f"unknown --device {device!r}", hint="use cuda or cpu")
    refuse_share_conflict(gpu_mem, extra)
    from qwenquant.serve.command import parse_size

    p = prepare(artifact, profiles[0], vllm=vllm, extra=extra, host=host, port=port,
                served_model_name=served_model_name, api_key=api_key, dry_run=dry_run, device=device, tp=tp,
                gpu_mem=parse_size(gpu_mem) if gpu_mem else None)
    for w in p.warnings:
        log.warning("%s", w)
    for n in p.notes:
        log.info("%s", n)
    if dry_run:
        print(format_command(p.command, p.env_add), flush=True)
        if p.failures:
            for e in p.failures:
                log.error("preflight failed: %s%s", e, f" (hint: {e.hint})" if e.hint else "")
            first = p.failures[0]
            err = QwenquantError(f"dry run: {len(p.failures)} preflight check(s) failed; `qwenquant serve` would "
                                 f"refuse to start (first: {first.message.splitlines()[0]})",
                                 hint="fix each failure listed above, then run the dry run again")
            err.exit_code = first.exit_code  # the same exit code as the serve that would have refused
            raise err
        return 0
    spec = server_spec(p, api_key=api_key, log_file=log_file, timeout=timeout)
    log.info("starting: %s", format_command(p.command, p.env_add))
    log.info("server log: %s", spec.log_path)
    return serve_forever(spec, lambda url: print(f"ready {url}", file=sys.stdout, flush=True))
