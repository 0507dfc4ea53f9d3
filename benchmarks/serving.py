"""What the serving benchmarks share: the product's own launch (`qwenquant serve ... ` run to its `ready URL`
line and stopped with Ctrl-C), a server started from the command `qwenquant serve --dry-run --json` prints
(for an artifact variant serve would refuse) waited for on /health, the linear kernel vLLM chose per scheme
(from its log), and Marlin forced on Hopper the way `qwenquant serve --activations int8` forces it."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
KERNEL = re.compile(r"Using (\w+) for (CompressedTensorsW\w+)")


def kernels(log: str) -> dict[str, str]:
    """The linear kernel vLLM chose per compressed-tensors scheme, from its log (the last line of each)."""
    return {m.group(2): m.group(1) for m in KERNEL.finditer(log)}


def kernels_of(log_file: Path) -> dict[str, str]:
    """`kernels` of the log at `log_file` ({} when there is none)."""
    return kernels(log_file.read_text(errors="replace")) if log_file.exists() else {}


def marlin_only(env: dict[str, str]) -> dict[str, str]:
    """`env` with the kernels vLLM prefers to Marlin on SM 9.0 disabled: the same variable and list
    `qwenquant serve --activations int8` sets (serve/activations.py), so Hopper runs what Ampere runs."""
    from qwenquant.serve.activations import DISABLED, HOPPER_FIRST

    return {**env, DISABLED: ",".join(HOPPER_FIRST)}


def cli_env() -> dict[str, str]:
    """This environment with the repository's src first on PYTHONPATH, for the qwenquant commands it runs."""
    return dict(
        os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO / "src"), os.environ.get("PYTHONPATH")) if p)
    )


def qwenquant_cli(*argv: str, env: dict[str, str] | None = None, timeout: float = 3600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "qwenquant", *argv], capture_output=True, text=True, env=env, timeout=timeout
    )


def stop(proc: subprocess.Popen, timeout: float = 180) -> int | None:
    """Ctrl-C a server still running (killed when it does not stop in `timeout` s); its exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()
    return proc.returncode


@contextlib.contextmanager
def serving(cmd: list[str], env: dict[str, str], out: dict[str, Any]) -> Iterator[str | None]:
    """Run `qwenquant serve ...` (`cmd`) to its `ready URL` line and yield the URL (None, with out["error"], when
    serve exited first; out["ready_s"] otherwise); stop it afterwards (out["serve_exit"])."""
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
    try:
        line = (p.stdout.readline() if p.stdout else "").strip()
        if not line.startswith("ready "):
            out["error"] = f"serve exited with {p.wait()} before ready (see {out.get('log')})"
            yield None
        else:
            out["ready_s"] = time.monotonic() - t0
            yield line.split()[1]
    finally:
        if p.poll() is None:
            out["serve_exit"] = stop(p)


def served_model(base: str) -> str:
    """The first model /v1/models lists."""
    from qwenquant.net.http import get_json

    return get_json(f"{base}/v1/models", timeout=10)["data"][0]["id"]


def wait_ready(base: str, proc: subprocess.Popen, timeout: float) -> str:
    """The served model's name once /health answers and /v1/models lists one (raises when the process dies)."""
    from qwenquant.net.http import HttpError, fetch

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"vLLM exited with {proc.returncode} before it was ready")
        try:
            if fetch(f"{base}/health", timeout=5).status == 200:
                return served_model(base)
        except HttpError:
            pass
        time.sleep(2)
    raise RuntimeError(f"not ready after {timeout:.0f} s")
