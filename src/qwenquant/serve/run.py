"""The body of `qwenquant serve`: preflight, then dry-run output or the supervised server."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from qwenquant.errors import QwenquantError, ServeError
from qwenquant.procenv import server_env
from qwenquant.serve.argv import format_command, mask_argv
from qwenquant.serve.launchplan import LaunchPlan, plan_json
from qwenquant.serve.preflight import default_log_path, prepare
from qwenquant.serve.request import ServeRequest
from qwenquant.serve.supervisor import ServerSpec, serve_forever

log = logging.getLogger(__name__)


def server_spec(p: LaunchPlan, req: ServeRequest) -> ServerSpec:
    """What the supervisor runs for a prepared launch (also used by `launched()`)."""
    return ServerSpec(
        command=p.command,
        env=launch_env(p),
        host=p.profile.host,
        port=p.profile.port,
        served_model_name=p.profile.served_model_name,
        artifact_root=str(p.artifact),
        api_key=req.api_key,
        log_path=req.log_file or default_log_path(p.artifact),
        timeout=req.timeout,
        ballast=p.ballast,
    )


def launch_env(p: LaunchPlan) -> dict[str, str]:
    """vLLM's whole environment: ours (less qwenquant's import path when isolated), the additions, less env_unset."""
    env = {**server_env(isolated=bool(p.install and p.install.isolated)), **p.env_add}
    for k in p.env_unset:
        env.pop(k, None)
    return env


def log_offset(path: Path) -> int:
    """Where the server's own lines will start in its log file (a --log-file may hold an earlier run's)."""
    try:
        return path.stat().st_size
    except OSError:
        return 0


def check_served(p: LaunchPlan, log_path: Path, offset: int) -> None:
    """After `ready`: what vLLM's log says it runs holds what was asked (serve/kernellog.py): int8 activations on a
    GPU through the Marlin variable fail (exit 7) when a W4A16 kernel that takes 16-bit activations ran."""
    from qwenquant.serve.kernellog import int8_problem, kernel_lines, read_new_lines

    if p.activations != "int8" or p.device != "cuda" or "--quantization" in p.args:
        return
    lines = read_new_lines(log_path, offset)
    problem = int8_problem(lines)
    if problem:
        raise ServeError(
            problem,
            hint="serve with --activations bf16, or see docs/known-issues.md#int8-activations "
            "for the kernels that take int8 activations",
        )
    if not kernel_lines(lines):
        log.warning(
            '--activations int8: vLLM\'s log names no W4A16 kernel ("Using ... for CompressedTensorsWNA16"), '
            "so whether int8 activations run cannot be read back"
        )


def report_prepared(p: LaunchPlan, label: str = "") -> None:
    """Log the preflight's warnings and notes (a bench configuration's label first)."""
    where = f"{label}: " if label else ""
    for w in p.warnings:
        log.warning("%s%s", where, w)
    for n in p.notes:
        log.info("%s%s", where, n)
    if p.ballast:
        log.info("%sballast (started before vLLM): %s", where, format_command(p.ballast, {}))


def _refuse_dry_run(p: LaunchPlan) -> None:
    for e in p.failures:
        log.error("preflight failed: %s%s", e, f" (hint: {e.hint})" if e.hint else "")
    first = p.failures[0]
    err = QwenquantError(
        f"dry run: {len(p.failures)} preflight check(s) failed; `qwenquant serve` would "
        f"refuse to start (first: {first.message.splitlines()[0]})",
        hint="fix each failure listed above, then run the dry run again",
    )
    err.exit_code = first.exit_code  # the same exit code as the serve that would have refused
    raise err


def dry_run_dict(p: LaunchPlan) -> dict:
    """`serve --dry-run --json`: the decided launch as data (the command line's argv, the API key
    masked as on the command line, and environment)."""
    from qwenquant.plan.report import budget_dict

    return {
        "artifact": str(p.artifact),
        "profile": p.profile.name,
        "device": p.device,
        "vllm": None if p.install is None else {"version": p.install.version, "source": p.install.source},
        "command": mask_argv(p.command),
        "env": p.env_add,
        "env_unset": list(p.env_unset),
        "activations": p.activations,
        "command_line": format_command(p.command, p.env_add, p.env_unset),
        "ballast": list(p.ballast),
        "budget": budget_dict(p.budget) if p.budget else None,
        "warnings": list(p.warnings),
        "notes": list(p.notes),
        **plan_json(p),
        "failures": [{"message": e.message, "hint": e.hint, "exit_code": e.exit_code} for e in p.failures],
    }


def run_serve(req: ServeRequest, *, as_json: bool = False) -> int:
    """Serve until stopped; return the exit code (errors raise UsageError, ServeError, VerificationError).
    `as_json` (with a dry run): the decided launch as JSON on stdout instead of the command line."""
    p = prepare(req)
    report_prepared(p)
    if req.dry_run:
        if as_json:
            from qwenquant.console import print_json

            print_json(dry_run_dict(p))
        else:
            print(format_command(p.command, p.env_add, p.env_unset), flush=True)
        if p.failures:
            _refuse_dry_run(p)
        return 0
    spec = server_spec(p, req)
    log.info("starting: %s", format_command(p.command, p.env_add, p.env_unset))
    log.info("server log: %s", spec.log_path)
    offset = log_offset(spec.log_path)

    def on_ready(url: str) -> None:
        check_served(p, spec.log_path, offset)
        print(f"ready {url}", file=sys.stdout, flush=True)

    return serve_forever(spec, on_ready)
