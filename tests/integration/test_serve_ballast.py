"""The hard `--gpu-mem` limit's ballast under `qwenquant serve` and `eval served --serve`: started before the
server, holding while it serves, stopped after it, and gone after SIGINT, SIGTERM and SIGKILL of
`qwenquant serve`; `--gpu-mem-soft` starts none; the dry run says which mode and what it holds.

STAND-INS (no GPU here): nvidia-smi is a script reporting an idle H200 (143771 MiB, 142771 MiB
free); QWENQUANT_BALLAST_STANDIN=FILE makes the real ballast process (serve/ballast.py, under its
watchdog, started by the real supervisor) hold nothing instead of calling the CUDA driver and write
its report to FILE; the server is tests/integration/standin.py run as vLLM with
--standin-ballast-file FILE, which refuses to start unless that ballast is alive, and records at
its SIGTERM whether the ballast still was. The GPU measurements are in benchmarks/README.md.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from standin import alive, build_standin_artifact, serve_env, write_fake_vllm

from qwenquant.net.ports import free_port

from helpers import ServedCLI, fake_nvidia_smi, flat, gone

MiB = 1024**2
H200 = ["0, GPU-standin, 143771, 142771"]
HELD = (142771 - 24576) // 2 * 2 * MiB  # all the free memory but 24 GiB, in whole 2 MiB pages


@pytest.fixture(scope="module")
def setup(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ballast")
    return {
        "artifact": build_standin_artifact(tiny_checkpoint, root / "artifact"),
        "launcher": write_fake_vllm(root / "fakevllm"),
    }


def _env(setup: dict[str, Path], tmp_path: Path, rows: list[str] = H200) -> dict[str, str]:
    env = serve_env(setup["launcher"], tmp_path)
    env["PATH"] = f"{fake_nvidia_smi(tmp_path, rows)}{os.pathsep}{env['PATH']}"
    env["QWENQUANT_BALLAST_STANDIN"] = str(tmp_path / "ballast.json")
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def _args(setup: dict[str, Path], tmp_path: Path, *opts: str, expect_ballast: bool = True) -> list[str]:
    check = ["--standin-ballast-file", str(tmp_path / "ballast.json")] if expect_ballast else []
    return [
        str(setup["artifact"]),
        "--vllm",
        str(setup["launcher"]),
        "--device",
        "cuda",
        "--port",
        str(free_port()),
        "--timeout",
        "60",
        "--log-file",
        str(tmp_path / "server.log"),
        *opts,
        "--",
        "--max-model-len",
        "2048",
        "--standin-pidfile",
        str(tmp_path / "pids"),
        *check,
    ]


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 0), (signal.SIGKILL, -signal.SIGKILL)])
def test_ballast_first_and_gone_after_serve_stops(setup, tmp_path, sig, code):
    with ServedCLI(*_args(setup, tmp_path, "--gpu-mem", "24GiB"), env=_env(setup, tmp_path), ready_timeout=120) as s:
        report = json.loads((tmp_path / "ballast.json").read_text())
        pid = report["pid"]
        assert alive(pid) and report["devices"][0]["held"] == HELD and report["devices"][0]["free"] == 24577 * MiB
        assert f"ballast pid {pid}: GPU 0 holds 115.42 GiB, 24.00 GiB left free" in flat(s.stderr)
        server_pids = [int(p) for p in (tmp_path / "pids").read_text().split()]
        assert s.stop(sig) == code, s.stderr
    assert gone(pid, wait=10), f"the ballast {pid} outlived `qwenquant serve` ({sig.name})"
    assert all(gone(p, wait=10) for p in server_pids)
    if sig != signal.SIGKILL:  # stopped last: it still held when the server got its SIGTERM
        assert json.loads((tmp_path / "ballast.json.at-server-stop").read_text()) == {"ballast_alive": True}
        assert "ballast stopped" in s.stderr


def test_a_ballast_that_dies_fails_the_server(setup, tmp_path):
    with ServedCLI(*_args(setup, tmp_path, "--gpu-mem", "24GiB"), env=_env(setup, tmp_path), ready_timeout=120) as s:
        pid = json.loads((tmp_path / "ballast.json").read_text())["pid"]
        os.kill(pid, signal.SIGKILL)
        rc = s.proc.wait(timeout=60)
    assert rc == 7, s.stderr
    assert "the --gpu-mem ballast exited (code" in flat(s.stderr) and "the limit no longer holds" in flat(s.stderr)
    assert all(gone(int(p), wait=10) for p in (tmp_path / "pids").read_text().split())


def test_soft_starts_no_ballast(setup, tmp_path):
    args = _args(setup, tmp_path, "--gpu-mem", "24GiB", "--gpu-mem-soft", expect_ballast=False)
    with ServedCLI(*args, env=_env(setup, tmp_path), ready_timeout=120) as s:
        assert not (tmp_path / "ballast.json").exists()
    assert "--gpu-mem-soft: no ballast" in flat(s.stderr) and "ballast pid" not in s.stderr


def _dry_run(setup: dict[str, Path], tmp_path: Path, *opts: str, rows: list[str] = H200) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "qwenquant", "serve", *_args(setup, tmp_path, "--dry-run", *opts)],
        env=_env(setup, tmp_path, rows),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_dry_run_says_which_mode_and_what_the_ballast_holds(setup, tmp_path):
    r = _dry_run(setup, tmp_path, "--gpu-mem", "24GiB")
    assert r.returncode == 0, r.stderr
    err = flat(r.stderr)
    assert (
        "--gpu-mem 24.00 GiB is a hard limit: a ballast process holds all but 24.00 GiB of the free memory, its "
        "own CUDA context included (GPU 0: 115.42 GiB of 140.40 GiB (139.42 GiB free now))"
    ) in err
    assert f"ballast (started before vLLM): {sys.executable} -I " in err and f"--size {24 * 1024 * MiB}" in err
    assert "--gpu-memory-utilization 0.157263" in r.stdout  # the budget as before
    assert not (tmp_path / "ballast.json").exists()  # a dry run starts nothing
    soft = _dry_run(setup, tmp_path, "--gpu-mem", "24GiB", "--gpu-mem-soft")
    assert soft.returncode == 0 and "--gpu-mem-soft: no ballast" in flat(soft.stderr)
    assert "ballast (started" not in soft.stderr and "--gpu-memory-utilization 0.157263" in soft.stdout


def test_a_gpu_without_the_size_free_is_refused(setup, tmp_path):
    """30000 MiB used by something else: 20.00 GiB free cannot leave 24 GiB to vLLM."""
    r = _dry_run(setup, tmp_path, "--gpu-mem", "24GiB", rows=["0, GPU-standin, 143771, 20480"])
    assert r.returncode == 7
    assert "GPU 0 has 20.00 GiB free of 140.40 GiB: less than --gpu-mem 24.00 GiB" in flat(r.stderr)


def test_an_explicit_share_beside_the_hard_limit_is_taken_and_named(setup, tmp_path):
    """0.18 of the H200 is more than the 24 GiB left to vLLM: kept (vLLM would refuse to start, as on
    the card), and said; beside --gpu-mem-soft it stays a usage error."""
    r = _dry_run(setup, tmp_path, "--gpu-mem", "24GiB", "--", "--gpu-memory-utilization", "0.18")
    assert r.returncode == 0, r.stderr
    assert "--gpu-memory-utilization 0.18" in r.stdout
    assert "more than the 24.00 GiB left to it: vLLM will refuse to start, as on the card" in flat(r.stderr)
    soft = _dry_run(setup, tmp_path, "--gpu-mem", "24GiB", "--gpu-mem-soft", "--", "--gpu-memory-utilization", "0.18")
    assert soft.returncode == 2 and "--gpu-mem-soft and --gpu-memory-utilization both set" in flat(soft.stderr)


def test_eval_serve_runs_under_the_ballast(setup, tmp_path):
    gate = tmp_path / "gate.json"
    gate.write_text(
        json.dumps({"name": "g", "tasks": [{"name": "t", "cases": [{"prompt": "hi", "expect": " world"}]}]})
    )
    args = _args(setup, tmp_path, "--gpu-mem", "24GiB")
    cmd = [
        sys.executable,
        "-m",
        "qwenquant",
        "eval",
        "served",
        "--serve",
        str(setup["artifact"]),
        "--vllm",
        str(setup["launcher"]),
        "--device",
        "cuda",
        "--timeout",
        "60",
        "--gpu-mem",
        "24GiB",
        "--gate",
        str(gate),
        "--json",
        *args[args.index("--") :],
    ]
    r = subprocess.run(cmd, env=_env(setup, tmp_path), capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert out["served"]["gpu_mem"] == "24GiB" and out["served"]["gpu_mem_limit"] == "hard"
    pid = json.loads((tmp_path / "ballast.json").read_text())["pid"]
    assert gone(pid, wait=10)
    assert json.loads((tmp_path / "ballast.json.at-server-stop").read_text()) == {"ballast_alive": True}


def _why_the_real_ballast_cannot_hold() -> str | None:
    """The error the real ballast stops with on this machine, asked of the CUDA driver independently of it:
    no driver, a driver without a usable GPU (cuInit or cuDeviceGet fails); None where a GPU is usable."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return "cannot load the CUDA driver (libcuda.so.1)"
    if lib.cuInit(0) != 0:
        return "cuInit failed"
    count = ctypes.c_int()
    if lib.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value == 0:
        return "cuDeviceGet(0) failed"
    return None


def test_a_ballast_that_cannot_hold_stops_serve_before_vllm(setup, tmp_path):
    """The real ballast (no stand-in) on a machine where it cannot hold a GPU (no CUDA driver, or no usable
    GPU behind one): `qwenquant serve` exits 7 quoting its error, and the server was never started (no
    pidfile). Where a GPU is usable the real ballast would hold its memory: there the stand-in tests above
    cover serve's side, and the GPU runs of benchmarks/RESULTS.md the ballast's."""
    why = _why_the_real_ballast_cannot_hold()
    if why is None:
        pytest.skip("a CUDA GPU is usable here: the real ballast would hold its memory")
    env = _env(setup, tmp_path)
    del env["QWENQUANT_BALLAST_STANDIN"]
    r = subprocess.run(
        [sys.executable, "-m", "qwenquant", "serve", *_args(setup, tmp_path, "--gpu-mem", "24GiB")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 7, r.stderr
    assert f"the --gpu-mem ballast exited with code 1 before holding the GPU: ballast: error {why}" in flat(r.stderr)
    assert "--gpu-mem-soft" in flat(r.stderr) and "Traceback" not in r.stderr
    assert not (tmp_path / "pids").exists()


def test_ctrl_c_before_ready_takes_the_ballast_too(setup, tmp_path):
    """A stand-in vLLM that never listens: Ctrl-C while serve waits for it stops both (exit 130)."""
    args = _args(setup, tmp_path, "--gpu-mem", "24GiB") + ["--standin-mode", "nobind"]
    p = subprocess.Popen(
        [sys.executable, "-m", "qwenquant", "serve", *args],
        env=_env(setup, tmp_path),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "pids").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (tmp_path / "pids").exists(), "the stand-in server never started"
        pid = json.loads((tmp_path / "ballast.json").read_text())["pid"]
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == 130, err
    assert gone(pid, wait=10) and all(gone(int(q), wait=10) for q in (tmp_path / "pids").read_text().split())
