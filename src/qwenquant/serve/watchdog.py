"""Run the server under a small watchdog that takes the whole process group down with `qwenquant serve`.

`qwenquant serve` starts `python -I .../watchdog.py PARENT_PID GRACE -- vllm ...` as the
leader of a new process group. The watchdog starts vLLM in that group (vLLM's engine-core children
stay in it) and waits. When `qwenquant serve` dies without stopping the server (SIGKILL, the OOM
killer), the watchdog notices at once through Linux's parent-death signal (PR_SET_PDEATHSIG), or
within half a second by polling getppid() elsewhere, sends SIGTERM to the group, waits GRACE
seconds, then SIGKILLs the group (itself included): nothing is left holding the GPU or the port.

The watchdog imports only the standard library and qwenquant.procenv (itself standard library
only) and runs isolated (-I: no PYTHONPATH, no script folder on sys.path), so it starts the same
whatever environment the server is given. The --gpu-mem ballast runs under a watchdog of its own.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

# Run as a file under -I (no PYTHONPATH): the package this file belongs to is found from the file
# itself, so a source checkout used through PYTHONPATH works as an installed one does.
if not __package__:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from qwenquant.procenv import set_parent_death_signal

POLL_SECONDS = 0.5
USAGE = "usage: python -I watchdog.py PARENT_PID GRACE_SECONDS -- COMMAND [ARGS...]"


class _Orphaned(Exception):
    """The process that started us is gone."""


def parse_args(argv: list[str]) -> tuple[int, float, list[str]]:
    """(parent pid, grace seconds, command) from `PARENT_PID GRACE -- COMMAND...`; ValueError if malformed."""
    if len(argv) < 4 or argv[2] != "--":
        raise ValueError(USAGE)
    parent, grace = int(argv[0]), float(argv[1])
    if parent <= 1 or grace < 0:
        raise ValueError(f"bad parent pid {parent} or grace {grace}: {USAGE}")
    return parent, grace, argv[3:]


def watchdog_command(python: str, parent_pid: int, grace: float, command: list[str]) -> list[str]:
    """The argv that runs `command` under the watchdog."""
    return [python, "-I", os.path.abspath(__file__), str(parent_pid), f"{grace:g}", "--", *command]


def _child_setup() -> None:
    # vLLM's main process dies with the watchdog too (the watchdog is single-threaded, so the
    # forking thread is the process); its engine cores are caught by the group kill.
    set_parent_death_signal(signal.SIGKILL)


def take_down_group(child: subprocess.Popen | None, grace: float) -> None:
    """SIGTERM our process group, give the server `grace` seconds, then SIGKILL the group (and us)."""
    try:
        os.killpg(0, signal.SIGTERM)  # our own SIGTERM handler is a no-op
    except ProcessLookupError:
        pass
    if child is not None:
        try:
            child.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    os.killpg(0, signal.SIGKILL)


def _exit_like(rc: int) -> int:
    """Leave with the child's status: its exit code, or death by the same signal."""
    if rc < 0:
        signal.signal(-rc, signal.SIG_DFL)
        os.kill(os.getpid(), -rc)
        return 128 - rc
    return rc


def main(argv: list[str]) -> int:
    """Run the command; take its process group down if our parent dies first."""
    try:
        parent, grace, command = parse_args(argv)
    except ValueError as e:
        print(f"qwenquant watchdog: {e}", file=sys.stderr)
        return 2
    if os.getpgrp() != os.getpid():
        os.setsid()  # never signal the group of whoever started us

    def on_parent_death(signum: int, frame: object) -> None:
        if os.getppid() != parent:
            raise _Orphaned()

    # Python-level handlers (not SIG_IGN) so the child gets default dispositions after exec;
    # a group SIGTERM reaches the server directly, and we then exit with its status.
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, lambda signum, frame: None)
    signal.signal(signal.SIGUSR1, on_parent_death)
    set_parent_death_signal(signal.SIGUSR1)
    child: subprocess.Popen | None = None
    try:
        if os.getppid() != parent:  # it died before prctl took effect
            raise _Orphaned()
        child = subprocess.Popen(command, preexec_fn=_child_setup)
        while True:
            try:
                rc = child.wait(timeout=POLL_SECONDS)
                break
            except subprocess.TimeoutExpired:
                if os.getppid() != parent:
                    raise _Orphaned() from None
    except _Orphaned:
        # nothing is printed here: the pipe to `qwenquant serve` has no reader any more
        take_down_group(child, grace)
        return 1
    except FileNotFoundError as e:
        print(f"qwenquant watchdog: cannot run {command[0]}: {e}", file=sys.stderr, flush=True)
        return 127
    return _exit_like(rc)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
