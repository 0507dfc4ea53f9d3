"""Ctrl-C (SIGINT to a real `qwenquant` process) in every command (publish: tests/integration/test_publish_evidence.py):
exit 130 and one line saying what the command did and what it did not, no traceback, nothing of the
user's changed. The command is stopped at a known point: one file it reads is a named pipe, and the
signal goes once the command has opened it (the test holds the writing end, so the read waits)."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import REPO, write_source_manifest, write_test_manifest

pytestmark = pytest.mark.slow


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "QWENQUANT_NO_PROGRESS": "1", "QWENQUANT_THREADS": "1", **extra}
    env.pop("QWENQUANT_DEBUG", None)
    return env


def _open_writer(fifo: Path, proc: subprocess.Popen, timeout: float = 120) -> int:
    """The writing end of `fifo`, once `proc` has opened it to read (ENXIO until a reader is there)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as e:
            if e.errno != errno.ENXIO:
                raise
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"the command ended (exit {proc.returncode}) before it read {fifo}:\n{err[-3000:]}")
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"the command did not open {fifo} in {timeout} s")


def interrupt_reading(argv: list[str], fifo: Path, sig: int = signal.SIGINT, **env: str) -> tuple[int, str]:
    """Run `qwenquant ARGV`, send SIGINT (or `sig`) once it reads `fifo`; (exit code, stderr)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "qwenquant", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(**env),
        cwd=REPO,
    )
    fd = _open_writer(fifo, proc)
    time.sleep(0.3)  # the reader is in read() now, waiting for bytes
    proc.send_signal(sig)
    time.sleep(0.3)
    os.close(fd)  # end of file for a reader on another thread, which the interrupted command may wait for
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err


def interrupt_hashing(argv: list[str], big: Path, **env: str) -> tuple[int, str]:
    """Run `qwenquant ARGV`, send SIGINT once it has `big` open (a 2 GiB file it hashes); (exit code, stderr)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "qwenquant", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(**env),
        cwd=REPO,
    )
    deadline = time.monotonic() + 120
    while not _has_open(proc.pid, big):
        assert proc.poll() is None, f"the command ended (exit {proc.returncode}) before it read {big}"
        assert time.monotonic() < deadline, f"the command did not open {big}"
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err


def _has_open(pid: int, path: Path) -> bool:
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == str(path):
                return True
        except OSError:
            continue
    return False


def _one_line(code: int, err: str, want: int = 130) -> str:
    """The interrupt line: exit 130 (143 for SIGTERM), exactly one line starting "interrupted", no traceback or
    error line."""
    assert code == want, err[-3000:]
    assert "Traceback" not in err and "error:" not in err and "unexpected error" not in err, err[-3000:]
    lines = [ln for ln in err.splitlines() if ln.startswith("interrupted")]
    assert len(lines) == 1, err[-3000:]
    return lines[0]


def _fifo(path: Path) -> Path:
    if path.exists():
        path.unlink()
    os.mkfifo(path)
    return path


def _files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def art(tiny_checkpoint: Path, tmp_path: Path) -> Path:
    """A copy of the tiny checkpoint with a manifest (an artifact as verify, check and plan read it)."""
    a = Path(shutil.copytree(tiny_checkpoint, tmp_path / "art"))
    write_source_manifest(a, tiny_checkpoint)
    return a


@pytest.fixture
def big_art(art: Path) -> Path:
    """The artifact with a 2 GiB file (sparse: no disk) its manifest lists, so hashing it takes a while."""
    with open(art / "big.bin", "wb") as f:
        f.truncate(2 << 30)
    write_test_manifest(art)
    return art


READ_ONLY = "stopped before it reported; it only reads, so nothing was written or changed"


def test_ctrl_c_in_verify_says_nothing_was_written(big_art: Path) -> None:
    before = {p.name: p.stat().st_mtime_ns for p in big_art.iterdir()}
    line = _one_line(*interrupt_hashing(["verify", str(big_art)], big_art / "big.bin"))
    assert line == f"interrupted: qwenquant verify {READ_ONLY}"
    assert {p.name: p.stat().st_mtime_ns for p in big_art.iterdir()} == before


def test_ctrl_c_in_check_plan_and_recipe_says_nothing_was_written(art: Path, tmp_path: Path) -> None:
    """check and plan reading config.json, recipe validate reading the YAML."""
    config = art / "config.json"
    text = config.read_bytes()
    for argv in (["check", str(art)], ["plan", str(config)]):
        _fifo(config)
        assert _one_line(*interrupt_reading(argv, config)) == f"interrupted: qwenquant {argv[0]} {READ_ONLY}"
    config.unlink()
    config.write_bytes(text)
    recipe = _fifo(tmp_path / "r.yaml")
    assert (
        _one_line(*interrupt_reading(["recipe", "validate", str(recipe)], recipe))
        == f"interrupted: qwenquant recipe {READ_ONLY}"
    )


def test_ctrl_c_in_quantize_plan_says_it_wrote_nothing(tiny_checkpoint: Path, tmp_path: Path) -> None:
    src = Path(shutil.copytree(tiny_checkpoint, tmp_path / "src"))
    _fifo(src / "config.json")
    line = _one_line(
        *interrupt_reading(
            [
                "quantize",
                str(src),
                "--source-unverified",
                "--calibration",
                "tiny-demo",
                "--out",
                str(tmp_path / "q"),
                "--plan",
            ],
            src / "config.json",
        )
    )
    assert line == "interrupted: quantize --plan stopped before it reported; it runs and writes nothing"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_sigterm_gives_the_ctrl_c_line_and_exit_143(art: Path, tiny_checkpoint: Path, tmp_path: Path) -> None:
    """`kill PID` (SIGTERM) stops a command as Ctrl-C does: the same line, the shell's code for a TERM."""
    config = _fifo(art / "config.json")
    assert (
        _one_line(*interrupt_reading(["check", str(art)], config, signal.SIGTERM), want=143)
        == f"interrupted: qwenquant check {READ_ONLY}"
    )
    src = Path(shutil.copytree(tiny_checkpoint, tmp_path / "src"))
    _fifo(src / "config.json")
    line = _one_line(
        *interrupt_reading(
            [
                "quantize",
                str(src),
                "--source-unverified",
                "--calibration",
                "tiny-demo",
                "--out",
                str(tmp_path / "q"),
                "--plan",
            ],
            src / "config.json",
            signal.SIGTERM,
        ),
        want=143,
    )
    assert line == "interrupted: quantize --plan stopped before it reported; it runs and writes nothing"


def test_ctrl_c_in_graft_mtp_leaves_the_artifact_as_it_was(art: Path, tiny_checkpoint: Path, tmp_path: Path) -> None:
    """Interrupted while it reads the source's MTP shard: the artifact's bytes as they were, nothing beside it."""
    src = Path(shutil.copytree(tiny_checkpoint, tmp_path / "src"))
    (art / "model-mtp.safetensors").unlink()  # what graft-mtp would restore
    before = _files(tmp_path / "art")
    _fifo(src / "model-mtp.safetensors")
    line = _one_line(*interrupt_reading(["graft-mtp", str(art), "--source", str(src)], src / "model-mtp.safetensors"))
    assert line.startswith(f"interrupted: {art} is as it was or fully grafted, never half-written")
    assert f"`qwenquant graft-mtp {art} --source {src} --check-only` says which" in line
    assert _files(tmp_path / "art") == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["art", "src"]


def test_ctrl_c_in_fetch_says_what_is_kept(served, tmp_path: Path) -> None:
    """Interrupted while one shard streams slowly: the line says what is kept; the re-run fetches
    only the rest and the folder verifies."""
    from support.hubserver import Fault

    served.hub.faults.add(Fault("slow", path="model-00002*", times=None, rate=50_000))
    out = tmp_path / "fetched"
    proc = subprocess.Popen(
        [sys.executable, "-m", "qwenquant", "fetch", served.repo_id, "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        cwd=REPO,
    )
    # the shard streams into .qwenquant-staging under its content's sha256 (it takes ~70 s at that rate), and
    # is renamed to its own name only once verified: the signal goes while that partial is growing
    key = hashlib.sha256((served.source / "model-00002-of-00002.safetensors").read_bytes()).hexdigest()
    deadline = time.monotonic() + 120
    while not [p for p in out.rglob(f"{key}.*.part") if p.is_file() and p.stat().st_size > 0]:
        assert proc.poll() is None and time.monotonic() < deadline, "the slow shard did not start"
        time.sleep(0.05)
    assert not (out / "model-00002-of-00002.safetensors").exists()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    line = _one_line(proc.returncode, err)
    assert line == (
        "interrupted: the files fetched and verified so far stay in the --out folder, the rest were not "
        "fetched; re-run the same command to fetch only the rest"
    )
    assert not (out / "model-00002-of-00002.safetensors").exists(), "the interrupted shard was renamed into place"
    served.hub.faults.clear()
    again = subprocess.run(
        [sys.executable, "-m", "qwenquant", "fetch", served.repo_id, "--out", str(out)],
        capture_output=True,
        text=True,
        env=_env(),
        cwd=REPO,
        timeout=300,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resuming model-00002-of-00002.safetensors at byte" in again.stderr, again.stderr[-3000:]


def test_ctrl_c_in_fetch_before_anything_was_fetched_says_so(tmp_path: Path) -> None:
    """A Hub that does not answer (nothing listens on the discard port): fetch retries, Ctrl-C stops it
    before any file came; the line says nothing was fetched."""
    out = tmp_path / "fetched"
    proc = subprocess.Popen(
        [sys.executable, "-m", "qwenquant", "fetch", "me/tiny", "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=_env(HF_ENDPOINT="http://127.0.0.1:9", QWENQUANT_FETCH_BACKOFF="30"),
    )
    deadline = time.monotonic() + 120
    while not (out / ".qwenquant-staging" / "lock").exists():  # it holds the folder's lock: it is fetching
        assert proc.poll() is None and time.monotonic() < deadline, "fetch did not start"
        time.sleep(0.05)
    time.sleep(1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert _one_line(proc.returncode, err) == "interrupted: nothing was fetched; re-run the same command to fetch"


def test_ctrl_c_in_serve_before_the_server_starts(big_art: Path) -> None:
    """Interrupted in the preflight (verify hashing the artifact): nothing started, nothing written."""
    line = _one_line(*interrupt_hashing(["serve", str(big_art), "--dry-run"], big_art / "big.bin"))
    assert line == "interrupted before the server started: nothing was started or written"


def test_ctrl_c_in_doctor(tmp_path: Path) -> None:
    """doctor asking the vLLM of QWENQUANT_VLLM for its version (a python that reads a pipe first)."""
    fifo = _fifo(tmp_path / "pipe")
    fake = tmp_path / "python"
    fake.write_text(f'#!/bin/sh\ncat {fifo} >/dev/null\nexec {sys.executable} "$@"\n')
    fake.chmod(0o755)
    line = _one_line(*interrupt_reading(["doctor"], fifo, QWENQUANT_VLLM=str(fake)))
    assert line == f"interrupted: qwenquant doctor {READ_ONLY}"


def test_ctrl_c_in_demo_names_the_step_and_what_is_kept(tmp_path: Path) -> None:
    """The demo interrupted in its fetch step (the loopback Hub serving a file that is a pipe)."""
    work = tmp_path / "demo"
    proc = subprocess.Popen(
        [sys.executable, "-m", "qwenquant", "demo", "--work", str(work), "--no-serve"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        cwd=REPO,
    )
    deadline = time.monotonic() + 300
    seen = ""
    while time.monotonic() < deadline and "$ qwenquant fetch" not in seen:
        seen += proc.stderr.readline()
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    line = _one_line(proc.returncode, seen + err)
    assert line == (
        f"interrupted in step fetch: the steps before it (build) are kept under {work}; re-run "
        f"`qwenquant demo --work {work}` to go on (each step reuses what verifies)"
    )
    assert json.loads((work / "hub" / "Qwen3.5-tiny" / "config.json").read_text())


def test_ctrl_c_line_of_every_command_is_known() -> None:
    """Every command but publish (its own line at the upload) has its own interrupt line (registered when it
    runs, or its default)."""
    from qwenquant.cli import app
    from qwenquant.commands._app import INTERRUPT_NOTES

    names = {c.name or c.callback.__name__ for c in app.registered_commands} | {g.name for g in app.registered_groups}
    own = {"quantize", "graft-mtp", "demo"}  # on_interrupt in the command
    assert names - {"publish"} == set(INTERRUPT_NOTES) | own


def test_ctrl_c_in_bench_says_no_report_was_written(tmp_path: Path) -> None:
    """bench run waits on its --config (a named pipe here) before it measures: no report, one line."""
    fifo = _fifo(tmp_path / "bench.yaml")
    out = tmp_path / "bench.json"
    code, err = interrupt_reading(
        ["bench", "run", "http://127.0.0.1:9", "--config", str(fifo), "--out", str(out)], fifo
    )
    assert _one_line(code, err) == (
        "interrupted: qwenquant bench stopped before its report: nothing was written, the "
        "figures measured so far are not kept, and a server that --serve started is "
        "stopped with it"
    )
    assert not out.exists() and not out.with_suffix(".png").exists()


def test_ctrl_c_in_eval_says_no_report_was_written(tmp_path: Path) -> None:
    """eval served against a server that takes the connection and never answers (a listening socket nobody
    accepts on): interrupted while it waits, no report, one line."""
    import socket

    report = tmp_path / "eval.json"
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(8)
        url = f"http://127.0.0.1:{srv.getsockname()[1]}"
        proc = subprocess.Popen(
            [sys.executable, "-m", "qwenquant", "eval", "served", url, "--report", str(report)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(),
            cwd=REPO,
        )
        time.sleep(8)  # started, connected, waiting for an answer
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    assert _one_line(proc.returncode, err).startswith("interrupted: qwenquant eval stopped before its report")
    assert not report.exists()


def test_ctrl_c_after_the_command_finished_keeps_its_exit_code() -> None:
    """A Ctrl-C that lands once the command is done (publish: after its commit, while the process waits for
    the Hub client's threads at exit) changes nothing: the exit code stays the command's (0), no traceback.
    The late signal is sent by the process to itself right after main() returned: the window the real
    `publish` has between its "published ... commit" line and its exit, made deterministic."""
    code = (
        "import os, signal, sys, time\n"
        "sys.argv = ['qwenquant', 'recipe', 'list']\n"
        "from qwenquant.cli import main\n"
        "rv = main()\n"
        "os.kill(os.getpid(), signal.SIGINT)\n"
        "time.sleep(5)\n"
        "print('still running after the Ctrl-C')\n"
        "sys.exit(rv)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=_env(), cwd=REPO
    )
    assert proc.returncode == 0, proc.stderr
    assert "still running" not in proc.stdout and "Traceback" not in proc.stderr and "w4a16-int4head" in proc.stdout
