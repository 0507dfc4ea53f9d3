"""Start an N-process gptq job from the gptq stage and watch it to the end.

The stage's process starts N `python -m qwenquant.quantize.engine.worker JOB_DIR` processes with an env://
rendezvous on 127.0.0.1 and a free port (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT),
each with NVLink multicast off (procenv.child_env). Rank 0 reports layer progress on its stdout
and writes the stage folder and `result.json`; a rank that fails writes `rank-R.error.json`.
Each worker runs in its own session (a terminal's Ctrl-C reaches this process only, which then
stops them all) and dies with this process (PR_SET_PDEATHSIG). When any rank fails, the others are
stopped and the cause is raised here (rank_error): the stage's staging folder is then never published,
and the layer records rank 0 wrote stay for the next run to resume from.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

from qwenquant import envs, errors
from qwenquant.atomic import atomic_write_json
from qwenquant.net.ports import free_port
from qwenquant.procenv import child_env

log = logging.getLogger(__name__)

JOB = "job.json"
RESULT = "result.json"
PROGRESS_TAG = "@@qwenquant-progress"
PARENT_ENV = "QWENQUANT_PARENT_PID"
LOG_LEVEL_ENV = "QWENQUANT_LOG_LEVEL"
STOP_GRACE_S = 10.0
SETTLE_S = 1.0
RESUME_HINT = ("the other ranks were stopped and nothing was published; re-run the same command to resume from the "
               "last completed decoder layer (QWENQUANT_DEBUG=1 prints the failing rank's traceback)")


def error_file(job_dir: Path, rank: int) -> Path:
    return Path(job_dir) / f"rank-{rank}.error.json"


def rank_env(base: Mapping[str, str], rank: int, world: int, port: int, device: str) -> dict[str, str]:
    """Pure: the environment of rank `rank`: `base` + multicast off + the env:// rendezvous. On the
    CPU the thread budget (QWENQUANT_THREADS, else every core) is shared among the ranks."""
    env = child_env(base)
    env.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world),
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), PARENT_ENV: str(os.getpid()),
                LOG_LEVEL_ENV: str(logging.getLogger("qwenquant").getEffectiveLevel())})
    if device == "cpu":
        threads = envs.get("QWENQUANT_THREADS", base) or (os.cpu_count() or 1)
        env["QWENQUANT_THREADS"] = str(max(1, threads // world))
    return env


def run_job(job: dict[str, Any], ranks: int, work: Path, progress: Callable[[int, int], None] | None) -> dict[str, Any]:
    """Run the gptq layer loop as `ranks` processes; return rank 0's result: `info` (the stage info),
    `layers` and `tail` (its phase seconds), `ranks` (every rank's figures, timings.Timings). Raises the first
    failing rank's error (StageError when it left none), KeyboardInterrupt after stopping them all."""
    job_dir = Path(tempfile.mkdtemp(prefix=".gptq-ranks.", suffix=".partial", dir=work))
    procs: list[subprocess.Popen] = []
    try:
        atomic_write_json(job_dir / JOB, job)
        port = free_port()
        log.info("gptq: %d processes (%s), rendezvous 127.0.0.1:%d", ranks,
                 "nccl, one GPU each" if job["device"] == "cuda" else "gloo on the CPU", port)
        for r in range(ranks):
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "qwenquant.quantize.engine.worker", str(job_dir)],
                env=rank_env(os.environ, r, ranks, port, job["device"]), stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE if r == 0 else subprocess.DEVNULL, start_new_session=True))
        _watch(procs, job_dir, progress)
        return json.loads((job_dir / RESULT).read_text())
    finally:
        stop(procs)
        shutil.rmtree(job_dir, ignore_errors=True)


def _read_lines(stream: IO[bytes], out: queue.Queue) -> None:
    for raw in iter(stream.readline, b""):
        out.put(raw.decode(errors="replace").rstrip("\n"))


def _watch(procs: list[subprocess.Popen], job_dir: Path, progress: Callable[[int, int], None] | None) -> None:
    """Poll the ranks until all exit 0; pass rank 0's progress lines on; raise on the first failure."""
    lines: queue.Queue = queue.Queue()
    reader = threading.Thread(target=_read_lines, args=(procs[0].stdout, lines), daemon=True)
    reader.start()

    def drain() -> None:
        while not lines.empty():
            line = lines.get_nowait()
            if line.startswith(PROGRESS_TAG + " "):
                i, n = (int(x) for x in line.split()[1:3])
                if progress:
                    progress(i, n)
            else:
                print(line, file=sys.stderr)  # stray stdout of a library in rank 0

    while True:
        drain()
        codes = [p.poll() for p in procs]
        if any(c not in (None, 0) for c in codes):
            codes = _settle(procs)
            stop(procs)
            raise rank_error(job_dir, {r: c for r, c in enumerate(codes) if c not in (None, 0)}, len(procs))
        if all(c == 0 for c in codes):
            reader.join(timeout=5)
            drain()
            return
        time.sleep(0.1)


def _settle(procs: list[subprocess.Popen], wait: float = SETTLE_S) -> list[int | None]:
    """The ranks' exit codes once the others had `wait` seconds to end on their own: the peers of a
    rank that died fail in their next collective a moment later, and the cause is picked from all
    of them (rank_error)."""
    deadline = time.monotonic() + wait
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(0.02)
    return [p.poll() for p in procs]


def stop(procs: list[subprocess.Popen], grace: float = STOP_GRACE_S) -> None:
    """SIGTERM every rank still running, SIGKILL what is left after `grace` seconds."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def rank_error(job_dir: Path, failed: dict[int, int], world: int) -> errors.QwenquantError:
    """The error to raise for the failed ranks (rank -> exit code), the cause rather than its echoes:
    a rank killed by a signal (the OOM killer, a kill) without a report first, since its peers then
    fail in their next collective with a connection error of their own; else the earliest report a
    rank wrote (a peer's failure makes the others fail later); else the lowest failed rank."""
    reports = {}
    for r in failed:
        try:
            reports[r] = json.loads(error_file(job_dir, r).read_text())
        except (OSError, ValueError):
            continue
    killed = {r: c for r, c in failed.items() if c < 0 and r not in reports}
    if killed or not reports:
        r, code = min((killed or failed).items())
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        return errors.StageError(f"gptq rank {r} of {world} {how} without reporting an error", hint=RESUME_HINT)
    r = min(reports, key=lambda k: (reports[k].get("at_ns", 0), k))
    rep = reports[r]
    cls = getattr(errors, str(rep.get("type")), None)
    if not (isinstance(cls, type) and issubclass(cls, errors.QwenquantError)) or cls is errors.RecipeError:
        cls = errors.StageError
    return cls(f"gptq rank {r} of {world}: {rep.get('message')}", hint=rep.get("hint") or RESUME_HINT)
