"""Run an N-process gptq job under PyTorch's launcher, `torch.distributed.run` (torchrun), and watch
it to the end.

The gptq stage starts one child, `python -m qwenquant.quantize.engine.launch JOB_DIR N`, in its own
session (a terminal's Ctrl-C reaches the stage's process only, which then stops the job), dying
with the stage's process (PR_SET_PDEATHSIG). That child runs torchrun's `main` with
`--standalone --nproc-per-node N`: its rendezvous on this host, one
`python -m qwenquant.quantize.engine.worker JOB_DIR` per rank (RANK, WORLD_SIZE, LOCAL_RANK and the
store's address in their environment), the per-rank error files its `@record` writes, and its
handling of a failed rank (the others are stopped) and of SIGTERM/SIGINT (every rank is stopped).
The ranks get NVLink multicast off (procenv.child_env) and, on the CPU, a share of the thread
budget. Rank 0 reports layer progress on its stdout and writes the stage folder and `result.json`.

When a rank fails, torchrun raises ChildFailedError with each failed rank's exit code and error
file; the child writes them to `failures.json`, and the stage raises the cause (`rank_error`): the
stage's staging folder is then never published, and the layer records rank 0 wrote stay for the
next run to resume from.
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
from qwenquant.procenv import child_env

log = logging.getLogger(__name__)

JOB = "job.json"
RESULT = "result.json"
FAILURES = "failures.json"
PROGRESS_TAG = "@@qwenquant-progress"
PARENT_ENV = "QWENQUANT_PARENT_PID"
LOG_LEVEL_ENV = "QWENQUANT_LOG_LEVEL"
REPORT_KEY = "qwenquant"  # the worker's own fields inside torchelastic's error file (extraInfo)
STOP_GRACE_S = 20.0
RESUME_HINT = (
    "the other ranks were stopped and nothing was published; re-run the same command to resume from the "
    "last completed decoder layer (QWENQUANT_DEBUG=1 prints the failing rank's traceback)"
)


def torchrun_args(job_dir: Path, ranks: int) -> list[str]:
    """Pure: torchrun's arguments for the job (a one-host rendezvous, error files under JOB_DIR/logs)."""
    return [
        "--standalone",
        "--nproc-per-node",
        str(ranks),
        "--max-restarts",
        "0",
        "--log-dir",
        str(Path(job_dir) / "logs"),
        "-m",
        "qwenquant.quantize.engine.worker",
        str(job_dir),
    ]


def job_env(base: Mapping[str, str], world: int, device: str) -> dict[str, str]:
    """Pure: the launcher's environment, which every rank inherits: `base` + multicast off + the log
    level. On the CPU the thread budget (QWENQUANT_THREADS, else every core) is shared among the
    ranks (OMP_NUM_THREADS with it, which torchrun would otherwise set to 1)."""
    env = child_env(base)
    env.update({PARENT_ENV: str(os.getpid()), LOG_LEVEL_ENV: str(logging.getLogger("qwenquant").getEffectiveLevel())})
    env.setdefault("LOGLEVEL", "ERROR")  # torchrun's own log lines: failures only
    if device == "cpu":
        threads = envs.get("QWENQUANT_THREADS", base) or (os.cpu_count() or 1)
        env["QWENQUANT_THREADS"] = env["OMP_NUM_THREADS"] = str(max(1, threads // world))
    return env


def run_job(job: dict[str, Any], ranks: int, work: Path, progress: Callable[[int, int], None] | None) -> dict[str, Any]:
    """Run the gptq layer loop as `ranks` processes; return rank 0's result: `info` (the stage info),
    `layers` and `tail` (its phase seconds), `ranks` (every rank's figures, timings.Timings). Raises the first
    failing rank's error (StageError when it left none), KeyboardInterrupt after stopping them all."""
    job_dir = Path(tempfile.mkdtemp(prefix=".gptq-ranks.", suffix=".partial", dir=work))
    proc: subprocess.Popen | None = None
    try:
        atomic_write_json(job_dir / JOB, job)
        log.info(
            "gptq: %d processes under torch.distributed.run (%s)",
            ranks,
            "nccl, one GPU each" if job["device"] == "cuda" else "gloo on the CPU",
        )
        proc = subprocess.Popen(
            [sys.executable, "-m", "qwenquant.quantize.engine.launch", str(job_dir), str(ranks)],
            env=job_env(os.environ, ranks, job["device"]),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        code = _watch(proc, progress)
        if code != 0:
            raise job_error(job_dir, code, ranks)
        return json.loads((job_dir / RESULT).read_text())
    finally:
        if proc is not None:
            stop(proc)
        shutil.rmtree(job_dir, ignore_errors=True)


def _read_lines(stream: IO[bytes], out: queue.Queue) -> None:
    for raw in iter(stream.readline, b""):
        out.put(raw.decode(errors="replace").rstrip("\n"))


def _watch(proc: subprocess.Popen, progress: Callable[[int, int], None] | None) -> int:
    """Pass rank 0's progress lines on until the job ends; its exit code."""
    lines: queue.Queue = queue.Queue()
    reader = threading.Thread(target=_read_lines, args=(proc.stdout, lines), daemon=True)
    reader.start()

    def drain() -> None:
        while not lines.empty():
            line = lines.get_nowait()
            if line.startswith(PROGRESS_TAG + " "):
                i, n = (int(x) for x in line.split()[1:3])
                if progress:
                    progress(i, n)
            else:
                print(line, file=sys.stderr)  # stray stdout of a library in a rank

    while proc.poll() is None:
        drain()
        time.sleep(0.1)
    reader.join(timeout=5)
    drain()
    return proc.returncode


def stop(proc: subprocess.Popen, grace: float = STOP_GRACE_S) -> None:
    """SIGTERM the launcher if it still runs (torchrun then stops every rank); SIGKILL after `grace`
    seconds (the ranks die with it: PR_SET_PDEATHSIG)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def job_error(job_dir: Path, code: int, world: int) -> errors.QwenquantError:
    """The error of a job whose launcher exited with `code`: the failing rank's (failures.json),
    else what happened to the launcher."""
    try:
        failed = json.loads((job_dir / FAILURES).read_text())
    except (OSError, ValueError):
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        return errors.StageError(
            f"the gptq launcher (torch.distributed.run) {how} without a rank failure", hint=RESUME_HINT
        )
    return rank_error(
        {int(r): f["exitcode"] for r, f in failed.items()},
        {int(r): f["report"] for r, f in failed.items() if f.get("report")},
        world,
    )


def rank_error(failed: dict[int, int], reports: dict[int, dict[str, Any]], world: int) -> errors.QwenquantError:
    """The error to raise for the failed ranks (rank -> exit code; rank -> the report its error file
    holds), the cause rather than its echoes: a rank killed by a signal (the OOM killer, a kill)
    without a report first, since its peers then fail in their next collective with a connection
    error of their own; else the earliest report (a peer's failure makes the others fail later);
    else the lowest failed rank. SIGTERM is how torchrun stops the ranks left after a failure, so a
    rank it ended comes last."""
    reports = {r: rep for r, rep in reports.items() if r in failed}
    killed = {r: c for r, c in failed.items() if c < 0 and c != -signal.SIGTERM and r not in reports}
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


def failure_record(exitcode: int, error_file_data: Mapping[str, Any]) -> dict[str, Any]:
    """Pure: one failed rank as failures.json holds it: torchrun's exit code and the worker's report
    from the error file its `@record` wrote (None when it wrote none: killed, or exited before)."""
    message = error_file_data.get("message")
    info = message.get("extraInfo", {}) if isinstance(message, dict) else {}
    return {"exitcode": exitcode, "report": info.get(REPORT_KEY)}


def main(argv: list[str] | None = None) -> int:
    """The launcher process: torchrun's main for the job in JOB_DIR with N ranks."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    from qwenquant.procenv import set_parent_death_signal

    job_dir, ranks = Path((argv or sys.argv[1:])[0]), int((argv or sys.argv[1:])[1])
    set_parent_death_signal(signal.SIGTERM)  # the stage's process died: torchrun stops the ranks
    if os.getppid() != envs.get(PARENT_ENV):
        return 1  # it was already gone before prctl took effect
    os.environ[PARENT_ENV] = str(os.getpid())  # the ranks die with this process
    if envs.get(LOG_LEVEL_ENV) > logging.DEBUG:  # torchrun's notes on stopping the ranks; its errors stay
        logging.getLogger("torch.distributed.elastic").setLevel(logging.ERROR)
    try:
        torchrun(torchrun_args(job_dir, ranks))
    except ChildFailedError as e:
        atomic_write_json(
            job_dir / FAILURES, {str(r): failure_record(f.exitcode, f.error_file_data) for r, f in e.failures.items()}
        )
        return 1
    except SignalException as e:
        return 128 + int(e.sigval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
