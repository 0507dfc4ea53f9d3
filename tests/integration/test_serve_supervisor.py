"""`qwenquant serve` against a stand-in server (tests/integration/standin.py, run as vLLM).

Every test here uses the stand-in because no real vLLM fails on demand (exit 0, never bind, stay
unhealthy, die after ready, list another model root). `qwenquant serve` runs as a subprocess:
its stdout, stderr and exit code are what a user sees. The artifact is a stand-in too: the tiny
checkpoint re-saved with zero-filled int4-packed Linears and a real manifest, so manifest
verification and `check_artifact` run for real; the stand-in never reads the weights.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from standin import build_standin_artifact, serve_env, write_fake_vllm

from qwenquant.net.ports import free_port

from helpers import ServedCLI, fake_nvidia_smi, flat, gone


@pytest.fixture(scope="session")
def standin_artifact(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_standin_artifact(tiny_checkpoint, tmp_path_factory.mktemp("serve") / "artifact")


@pytest.fixture(scope="session")
def fake_vllm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_fake_vllm(tmp_path_factory.mktemp("fakevllm"))


def serve_args(artifact: Path, launcher: Path, port: int, mode: str, pidfile: Path, timeout: float = 20) -> list[str]:
    """`qwenquant serve`'s arguments for the stand-in in `mode` (vLLM flags last, after `--`)."""
    return [
        str(artifact),
        "--profile",
        "single-user",
        "--port",
        str(port),
        "--vllm",
        str(launcher),
        "--timeout",
        str(timeout),
        "--log-file",
        str(pidfile.with_name("server.log")),
        "--",
        "--max-model-len",
        "2048",
        "--standin-mode",
        mode,
        "--standin-pidfile",
        str(pidfile),
    ]


def serve_cmd(*args: object, **kw: object) -> list[str]:
    return [sys.executable, "-m", "qwenquant", "serve", *serve_args(*args, **kw)]  # type: ignore[arg-type]


def run_failing(
    artifact: Path, launcher: Path, tmp_path: Path, mode: str, timeout: float = 20, wait: float | None = None
) -> subprocess.CompletedProcess:
    pidfile = tmp_path / "pids"
    r = subprocess.run(
        serve_cmd(artifact, launcher, free_port(), mode, pidfile, timeout),
        env=serve_env(launcher, tmp_path),
        capture_output=True,
        text=True,
        timeout=wait or timeout + 60,
    )
    assert "ready" not in r.stdout
    if pidfile.exists():
        for pid in map(int, pidfile.read_text().split()):
            assert gone(pid), f"process {pid} left running after a failed serve"
    return r


@pytest.mark.parametrize(
    "mode, expect",
    [
        ("exit0", "exited with code 0 before it was ready"),
        ("exit1", "exited with code 1 before it was ready"),
    ],
)
def test_server_exits_before_ready(standin_artifact, fake_vllm, tmp_path, mode, expect):
    """Stand-in (no real vLLM exits on demand): an exit, even with code 0, is a failure with the log tail."""
    r = run_failing(standin_artifact, fake_vllm, tmp_path, mode)
    assert r.returncode == 7, r.stderr
    assert expect in flat(r.stderr)
    assert "standin: mode=" in r.stderr  # the last log lines are shown
    if mode == "exit1":
        assert "RuntimeError: standin failed to load the model" in flat(r.stderr)
        assert "RuntimeError: standin failed" in (tmp_path / "server.log").read_text()  # the full log


def test_never_binds(standin_artifact, fake_vllm, tmp_path):
    """Stand-in that never listens: a timeout naming the cause, child stopped."""
    t0 = time.monotonic()
    r = run_failing(standin_artifact, fake_vllm, tmp_path, "nobind", timeout=4)
    assert r.returncode == 7
    assert "not ready within 4 s: nothing listens on port" in flat(r.stderr)
    assert time.monotonic() - t0 < 60


def test_fatal_line_before_ready_fails_without_waiting_for_the_timeout(standin_artifact, fake_vllm, tmp_path):
    """Stand-in (a real engine does not die on demand) that logs a worker's fatal error and then
    hangs without listening: serve fails once the grace after that line is over, quoting it, long
    before its 600 s --timeout (the subprocess timeout below would fire first), and stops the child."""
    r = run_failing(standin_artifact, fake_vllm, tmp_path, "fatal-hang", timeout=600, wait=120)
    assert r.returncode == 7, r.stderr
    assert "vLLM reported a fatal error while starting and did not exit" in flat(r.stderr)
    assert "WorkerProc hit an exception" in flat(r.stderr)


def test_health_stays_503(standin_artifact, fake_vllm, tmp_path):
    """Stand-in whose /health stays 503: a timeout naming the status."""
    r = run_failing(standin_artifact, fake_vllm, tmp_path, "health503", timeout=4)
    assert r.returncode == 7
    assert "/health answered 503" in flat(r.stderr)


def test_wrong_model_root(standin_artifact, fake_vllm, tmp_path):
    """Stand-in listing another root in /v1/models: refused at once, not after the timeout."""
    t0 = time.monotonic()
    r = run_failing(standin_artifact, fake_vllm, tmp_path, "wrong-root", timeout=60)
    assert r.returncode == 7
    assert "from '/somewhere/else', not from the artifact" in flat(r.stderr)
    assert time.monotonic() - t0 < 50


def test_port_already_held(standin_artifact, fake_vllm, tmp_path):
    """A port held by another process before launch: an error before anything starts."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        pidfile = tmp_path / "pids"
        r = subprocess.run(
            serve_cmd(standin_artifact, fake_vllm, port, "good", pidfile),
            env=serve_env(fake_vllm, tmp_path),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert r.returncode == 7
    assert f"port {port} on 127.0.0.1 is already in use by pid {os.getpid()}" in flat(r.stderr)
    assert not pidfile.exists()  # the server was never started
    assert "ready" not in r.stdout


def served(artifact: Path, launcher: Path, tmp_path: Path, mode: str, *more: str) -> ServedCLI:
    """`qwenquant serve` of the stand-in in `mode` on a free port, for a with-block; `more` go to the stand-in."""
    return ServedCLI(
        *serve_args(artifact, launcher, free_port(), mode, tmp_path / "pids"),
        *more,
        env=serve_env(launcher, tmp_path),
        ready_timeout=60,
    )


def test_dies_after_ready(standin_artifact, fake_vllm, tmp_path):
    """Stand-in that exits 3 after it was ready: serve exits non-zero with its last log lines."""
    with served(standin_artifact, fake_vllm, tmp_path, "die-after-ready") as s:
        assert s.url == f"http://127.0.0.1:{s.port}"
        rc = s.proc.wait(timeout=30)
    assert rc == 7
    assert "exited with code 3 after it was ready" in flat(s.stderr)
    assert "standin: dying" in flat(s.stderr)
    for pid in map(int, (tmp_path / "pids").read_text().split()):
        assert gone(pid)


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 0), (signal.SIGINT, 130)])
def test_good_server_ready_then_stopped(standin_artifact, fake_vllm, tmp_path, sig, code):
    """A good stand-in reaches ready; SIGTERM (exit 0) or Ctrl-C (exit 130) to `qwenquant serve`
    stops it and leaves no child."""
    with served(standin_artifact, fake_vllm, tmp_path, "good") as s:
        server_pid, helper_pid = map(int, (tmp_path / "pids").read_text().split())
        assert not gone(server_pid, wait=0.2)
        rc = s.stop(sig)
    assert rc == code, s.stderr
    assert "stopped" in flat(s.stderr)
    assert gone(server_pid) and gone(helper_pid)


def test_serve_killed_takes_the_server_with_it(standin_artifact, fake_vllm, tmp_path):
    """kill -9 of `qwenquant serve` (as the OOM killer does): the server, its engine-like child
    (which ignores SIGTERM and is left behind by the server) and the watchdog are all gone within
    seconds, and the port is free again."""
    from qwenquant.net.ports import port_problem, process_tree

    with served(standin_artifact, fake_vllm, tmp_path, "good", "--standin-stubborn-helper") as s:
        server_pid, helper_pid = map(int, (tmp_path / "pids").read_text().split())
        tree = process_tree(s.proc.pid) - {s.proc.pid}
        assert {server_pid, helper_pid} < tree  # the watchdog is the third
        s.stop(signal.SIGKILL, timeout=10)
    survivors = [pid for pid in sorted(tree) if not gone(pid)]
    for pid in survivors:  # do not leave them running after a failure
        os.kill(pid, signal.SIGKILL)
    assert not survivors, f"processes {survivors} outlived the killed `qwenquant serve`: {s.stderr}"
    assert port_problem("127.0.0.1", s.port) is None


def test_api_key_used_for_readiness_and_never_shown(standin_artifact, fake_vllm, tmp_path):
    """The stand-in requires the key on /v1/*: serve reaches ready with it; when the server then
    dies, the log tail shown (which echoes vLLM's argv) has the key masked."""
    args = serve_args(standin_artifact, fake_vllm, free_port(), "die-after-ready", tmp_path / "pids")
    args[args.index("--") : args.index("--")] = ["--api-key", "s3cret-key"]
    with ServedCLI(*args, env=serve_env(fake_vllm, tmp_path), ready_timeout=60) as s:
        rc = s.proc.wait(timeout=30)
    assert rc == 7
    assert "argv=" in s.stderr and "'****'" in s.stderr
    assert "s3cret-key" not in s.stderr


def test_tampered_artifact_refused(standin_artifact, fake_vllm, tmp_path):
    """A changed file is named and nothing starts."""
    import shutil

    art = Path(shutil.copytree(standin_artifact, tmp_path / "art"))
    cfg = art / "generation_config.json"
    cfg.write_text(cfg.read_text().replace("{", "{ ", 1))
    pidfile = tmp_path / "pids"
    r = subprocess.run(
        serve_cmd(art, fake_vllm, free_port(), "good", pidfile),
        env=serve_env(fake_vllm, tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 4, r.stderr
    assert "generation_config.json" in flat(r.stderr)
    assert not pidfile.exists()


def test_context_longer_than_the_model_refused(standin_artifact, fake_vllm, tmp_path):
    """The profile's 32768 tokens exceed the tiny model's 4096 positions: refused before launch."""
    cmd = serve_cmd(standin_artifact, fake_vllm, free_port(), "good", tmp_path / "pids")
    del cmd[cmd.index("--max-model-len") : cmd.index("--max-model-len") + 2]
    r = subprocess.run(cmd, env=serve_env(fake_vllm, tmp_path), capture_output=True, text=True, timeout=120)
    assert r.returncode == 7
    assert "max-model-len 32768 is above the model's max_position_embeddings 4096" in flat(r.stderr)
    assert not (tmp_path / "pids").exists()


def test_context_longer_than_the_model_allowed_warns_about_mtp(standin_artifact, fake_vllm, tmp_path):
    """Allowed by VLLM_ALLOW_LONG_MAX_MODEL_LEN, the single-user profile (MTP on) is served past the 4096
    positions, and the warning says the drafter stops at 4096: vLLM gives the drafter's config no dict
    --hf-overrides, so every draft past it is rejected (seen on CUDA vLLM 0.26, benchmarks/RESULTS.md)."""
    cmd = serve_cmd(standin_artifact, fake_vllm, free_port(), "good", tmp_path / "pids")
    del cmd[cmd.index("--max-model-len") : cmd.index("--max-model-len") + 2]
    cmd.insert(cmd.index("--"), "--dry-run")
    env = {**serve_env(fake_vllm, tmp_path), "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    err = flat(r.stderr)
    assert "positions beyond 4096 were never trained" in err
    assert "MTP past position 4096: the drafter keeps the checkpoint's max_position_embeddings" in err


def test_dry_run_masks_api_key(standin_artifact, fake_vllm, tmp_path):
    """--dry-run prints the command and environment, never the key, and starts nothing."""
    pidfile = tmp_path / "pids"
    cmd = serve_cmd(standin_artifact, fake_vllm, free_port(), "good", pidfile)
    cmd[cmd.index("--") : cmd.index("--")] = ["--dry-run", "--api-key", "s3cret-key"]
    r = subprocess.run(cmd, env=serve_env(fake_vllm, tmp_path), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "s3cret-key" not in r.stdout + r.stderr
    assert "--api-key '****'" in r.stdout or "--api-key ****" in r.stdout
    assert "VLLM_CPU_KVCACHE_SPACE=1" in r.stdout and "--enforce-eager" in r.stdout
    assert not pidfile.exists()


def _dry_run(artifact: Path, launcher: Path, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "qwenquant",
        "serve",
        str(artifact),
        "--vllm",
        str(launcher),
        "--port",
        str(free_port()),
        "--dry-run",
        *extra,
        "--",
        "--max-model-len",
        "2048",
    ]
    return subprocess.run(cmd, env=serve_env(launcher, tmp_path), capture_output=True, text=True, timeout=120)


def test_dry_run_defaults_to_single_user_and_the_folder_name(standin_artifact, fake_vllm, tmp_path):
    """No --profile: single-user (MTP speculative decoding); the served name is the artifact folder's."""
    r = _dry_run(standin_artifact, fake_vllm, tmp_path)
    assert r.returncode == 0, r.stderr
    assert "--speculative-config" in r.stdout and "--max-num-seqs 1" in r.stdout
    assert f"--served-model-name {standin_artifact.name} " in r.stdout
    assert "qwen3.8-27b" not in r.stdout  # the recipe's name is for the real 27B only
    r = _dry_run(standin_artifact, fake_vllm, tmp_path, "--served-model-name", "mine")
    assert r.returncode == 0 and "--served-model-name mine " in r.stdout


def test_dry_run_json_is_the_command_line_as_data(standin_artifact, fake_vllm, tmp_path):
    """`--dry-run --json`: the same launch as the command line (argv, environment, profile, budget) as
    JSON on stdout, the key masked; without --dry-run, --json is a usage error (exit 2)."""
    import shlex

    text = _dry_run(standin_artifact, fake_vllm, tmp_path, "--api-key", "s3cret-key")
    r = _dry_run(standin_artifact, fake_vllm, tmp_path, "--api-key", "s3cret-key", "--json")
    assert r.returncode == 0 and text.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["profile"] == "single-user" and d["failures"] == [] and d["artifact"] == str(standin_artifact)
    port = d["command"][d["command"].index("--port") + 1]
    assert d["command_line"] == text.stdout.strip().replace(text.stdout.split("--port ")[1].split()[0], port)
    assert "s3cret-key" not in r.stdout and shlex.split(d["command_line"])[-len(d["command"]) :] == d["command"]
    assert d["budget"]["max_model_len"] == 2048 and d["vllm"]["source"] == "--vllm"
    bad = subprocess.run(
        [sys.executable, "-m", "qwenquant", "serve", str(standin_artifact), "--json"],
        env=serve_env(fake_vllm, tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "--json goes with --dry-run" in bad.stderr


def test_host_embeddings_in_the_shell_do_not_reach_vllm(standin_artifact, fake_vllm, tmp_path):
    """QWENQUANT_HOST_EMBEDDINGS=1 in the user's shell would make the host-embeddings plugin move vLLM's input
    embeddings behind serve's memory plan: serve removes it from vLLM's environment and says so."""
    cmd = [
        sys.executable,
        "-m",
        "qwenquant",
        "serve",
        str(standin_artifact),
        "--vllm",
        str(fake_vllm),
        "--port",
        str(free_port()),
        "--dry-run",
        "--json",
        "--",
        "--max-model-len",
        "2048",
    ]
    env = serve_env(fake_vllm, tmp_path) | {"QWENQUANT_HOST_EMBEDDINGS": "1"}
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert "QWENQUANT_HOST_EMBEDDINGS" in d["env_unset"] and "QWENQUANT_HOST_EMBEDDINGS" not in d["env"]
    assert any(
        w.startswith("QWENQUANT_HOST_EMBEDDINGS is set in this shell: vLLM does not get it") for w in d["warnings"]
    )
    r = _dry_run(standin_artifact, fake_vllm, tmp_path, "--json")
    assert "QWENQUANT_HOST_EMBEDDINGS" not in json.loads(r.stdout)["env_unset"]


def test_dry_run_shows_the_tool_call_parser_and_strict_level(standin_artifact, fake_vllm, tmp_path):
    """The stub vLLM (0.33.0) lists no tool parsers and no flags to the probe: qwen3_coder is assumed (every
    supported vLLM has it) and --tool-strict-level follows from the version (0.31 on)."""
    r = _dry_run(standin_artifact, fake_vllm, tmp_path)
    assert r.returncode == 0, r.stderr
    assert "--enable-auto-tool-choice --tool-call-parser qwen3_coder --tool-strict-level parameter" in r.stdout
    r = _dry_run(standin_artifact, fake_vllm, tmp_path, "--profile", "long-context")
    assert r.returncode == 0, r.stderr
    assert "--max-model-len 2048" in r.stdout and "--kv-cache-dtype fp8" in r.stdout


def test_dry_run_runs_the_whole_preflight_on_a_tampered_artifact(standin_artifact, fake_vllm, tmp_path):
    """A dry run verifies too: the command is printed, every failed check is listed, exit 4."""
    import shutil

    art = Path(shutil.copytree(standin_artifact, tmp_path / "art"))
    cfg = art / "generation_config.json"
    cfg.write_text(cfg.read_text().replace("{", "{ ", 1))
    cmd = [sys.executable, "-m", "qwenquant", "serve", str(art), "--vllm", str(fake_vllm), "--dry-run"]
    r = subprocess.run(cmd, env=serve_env(fake_vllm, tmp_path), capture_output=True, text=True, timeout=120)
    assert r.returncode == 4, r.stderr
    assert str(art) in r.stdout and "--speculative-config" in r.stdout  # the command, still printed
    err = flat(r.stderr)
    assert "preflight failed: artifact" in err and "generation_config.json" in err
    # the tiny model's 4096 positions are below the profile's 32768: listed as a second failure
    assert "max-model-len 32768 is above the model's max_position_embeddings 4096" in err
    assert "dry run: 2 preflight check(s) failed" in err
    assert "Traceback" not in r.stderr


def test_demo_serve_step_says_it_stops_the_demo_server(standin_artifact, fake_vllm, tmp_path, capfd):
    """The demo's serve step through the real `qwenquant serve` (stand-in server): it prints its own
    "stopping the demo server" line, not the supervisor's SIGTERM line that reads like a failure."""
    from qwenquant.demo import serve_and_complete

    env = dict(serve_env(fake_vllm, tmp_path), QWENQUANT_VLLM=str(fake_vllm))
    text = serve_and_complete(standin_artifact, env, timeout=120)
    err = capfd.readouterr().err
    assert isinstance(text, str) and "ready http://127.0.0.1:" in err
    assert "stopping the demo server" in err
    assert "stopping the server" not in err.replace("stopping the demo server", "")


MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def _served_env(args: list[str], env: dict[str, str], envfile: Path) -> dict[str, str]:
    """Serve the stand-in until ready, read the environment it saw, stop it (Ctrl-C, exit 130)."""
    with ServedCLI(*args, env=env, ready_timeout=60):
        return json.loads(envfile.read_text())


def test_server_environment_has_multicast_off(standin_artifact, fake_vllm, tmp_path):
    """The served stand-in's own environment holds the three multicast-off variables; one the user
    set (NCCL_NVLS_ENABLE=1 here) is passed through unchanged."""
    envfile = tmp_path / "server-env.json"
    args = serve_args(standin_artifact, fake_vllm, free_port(), "good", tmp_path / "pids") + [
        "--standin-envfile",
        str(envfile),
    ]
    env = serve_env(fake_vllm, tmp_path)
    for k in MULTICAST_OFF:
        env.pop(k, None)
    child = _served_env(args, dict(env, NCCL_NVLS_ENABLE="1"), envfile)
    assert child["NCCL_NVLS_ENABLE"] == "1"
    assert child["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1" and child["NVSHMEM_DISABLE_NVLS"] == "1"
    child = _served_env(args, env, envfile)
    assert {k: child.get(k) for k in MULTICAST_OFF} == MULTICAST_OFF


def test_dry_run_shows_multicast_off(standin_artifact, fake_vllm, tmp_path):
    r = _dry_run(standin_artifact, fake_vllm, tmp_path)
    assert r.returncode == 0, r.stderr
    assert all(f"{k}={v}" in r.stdout for k, v in MULTICAST_OFF.items())


def test_gpus_refused_on_cpu(standin_artifact, fake_vllm, tmp_path):
    """The stand-in vLLM is a CPU build: --gpus 2 is a usage error, and nothing starts."""
    r = _dry_run(standin_artifact, fake_vllm, tmp_path, "--gpus", "2")
    assert r.returncode == 2, r.stderr
    assert "--gpus 2 needs a CUDA vLLM build and 2 NVIDIA GPUs; this vLLM serves on cpu" in flat(r.stderr)


@pytest.mark.parametrize(
    "rows, ok",
    [
        (["0, GPU-a, 24576, 24000", "1, GPU-b, 24576, 23900"], True),
        (["0, GPU-a, 24576, 24000", "1, GPU-b, 24576, 2000"], False),
    ],
)
def test_dry_run_two_gpus(standin_artifact, fake_vllm, tmp_path, rows, ok):
    """--device cuda --gpus 2 with a stand-in nvidia-smi: the argv holds --tensor-parallel-size 2;
    a busy second GPU is named and the dry run fails as serve would."""
    env = serve_env(fake_vllm, tmp_path)
    env["PATH"] = os.pathsep.join([str(fake_nvidia_smi(tmp_path, rows)), env.get("PATH", "")])
    env.pop("CUDA_VISIBLE_DEVICES", None)
    cmd = [
        sys.executable,
        "-m",
        "qwenquant",
        "serve",
        str(standin_artifact),
        "--vllm",
        str(fake_vllm),
        "--port",
        str(free_port()),
        "--dry-run",
        "--device",
        "cuda",
        "--gpus",
        "2",
        "--",
        "--max-model-len",
        "2048",
    ]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert "--tensor-parallel-size 2" in r.stdout
    if ok:
        assert r.returncode == 0, r.stderr
    else:
        assert r.returncode == 7
        assert "GPU 1 has 1.95 GiB free of 24.00 GiB" in flat(r.stderr) and "GPU 0 has" not in r.stderr


def test_gpu_mem_sets_the_share_of_a_bigger_gpu(standin_artifact, fake_vllm, tmp_path):
    """--gpu-mem 24GiB on a 143771 MiB GPU: the dry run passes vLLM the share that gives a 24 GiB
    card's budget (24576 x 0.92 / 143771 = 0.157263) and says how it got there. nvidia-smi is a
    stand-in: no GPU can run here."""
    env = serve_env(fake_vllm, tmp_path)
    env["PATH"] = f"{fake_nvidia_smi(tmp_path, ['0, GPU-standin, 143771, 142771'])}{os.pathsep}{env['PATH']}"
    cmd = serve_cmd(standin_artifact, fake_vllm, free_port(), "good", tmp_path / "pids")
    cmd[cmd.index("--") : cmd.index("--")] = ["--dry-run", "--device", "cuda", "--gpu-mem", "24GiB"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "--gpu-memory-utilization 0.157263" in r.stdout
    assert (
        "--gpu-mem 24.00 GiB: budget 22.08 GiB (24.00 GiB x 0.92) = --gpu-memory-utilization 0.157263 of "
        "this GPU's 140.40 GiB" in flat(r.stderr)
    )


def test_gpu_mem_refused_on_cpu(standin_artifact, fake_vllm, tmp_path):
    """The CPU build has no GPU budget to scale: --gpu-mem is refused, naming VLLM_CPU_KVCACHE_SPACE, with
    the code of every "needs a GPU" mistake (--gpus 2 here, quantize --device cuda without one): usage."""
    cmd = serve_cmd(standin_artifact, fake_vllm, free_port(), "good", tmp_path / "pids")
    cmd[cmd.index("--") : cmd.index("--")] = ["--gpu-mem", "24GiB"]
    r = subprocess.run(cmd, env=serve_env(fake_vllm, tmp_path), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "--gpu-mem applies to CUDA GPUs only" in flat(r.stderr) and "VLLM_CPU_KVCACHE_SPACE" in flat(r.stderr)
    assert not (tmp_path / "pids").exists()


def test_more_than_four_draft_tokens_refused_before_launch(standin_artifact, fake_vllm, tmp_path):
    """`-- --speculative-config` with 5 MTP tokens: refused (exit 7) naming vllm #37035; 4 is served."""
    five = '{"method": "mtp", "num_speculative_tokens": 5}'

    def dry(spec: str) -> subprocess.CompletedProcess:
        cmd = [
            sys.executable,
            "-m",
            "qwenquant",
            "serve",
            str(standin_artifact),
            "--vllm",
            str(fake_vllm),
            "--port",
            str(free_port()),
            "--dry-run",
            "--",
            "--max-model-len",
            "2048",
            "--speculative-config",
            spec,
        ]
        return subprocess.run(cmd, env=serve_env(fake_vllm, tmp_path), capture_output=True, text=True, timeout=120)

    r = dry(five)
    assert r.returncode == 7, r.stderr
    err = flat(r.stderr)
    assert "num_speculative_tokens 5 is above 4" in err and "(vllm #37035)" in err
    assert "draft at most 4 tokens" in err
    r = dry(five.replace("5", "4"))
    assert r.returncode == 0, r.stderr
    assert '"num_speculative_tokens": 4' in r.stdout or '"num_speculative_tokens":4' in r.stdout
