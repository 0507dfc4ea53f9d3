"""The serve-time guards of the vLLM version table, as `qwenquant serve` shows them: --activations int8 on vLLM 0.33
(the Marlin variable) and on 0.34 (which refuses the variable and whose Humming route drops our int4 head: exit 7,
the variable never passed), pipeline parallelism with an MTP profile refused (exit 7) unless MTP is off, the
automatic layout picking tensor for MTP profiles, prefix caching with MTP warned about (vllm #53912), pipeline
parallelism on vLLM's CPU build refused (exit 2, as tensor is), `--split` without `--gpus`, a pipeline stage with no
layers, and after a real start the kernel vLLM's log names for int8 layers (16-bit ran: exit 7, the line named).

STAND-INS (no GPU here): the machines of tests/integration/machines.py: nvidia-smi is tests/helpers.py's script (GPUs, compute capability, link matrices); vLLM is
tests/integration/standin.py's launcher and stub package with the version each test names (it logs the kernel
line vLLM logs when asked to).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from machines import dry_run, machine_env, serve_argv
from standin import build_standin_artifact

from qwenquant.net.ports import free_port

from helpers import flat

VAR = "VLLM_MARLIN_INPUT_DTYPE"


@pytest.fixture(scope="module")
def artifact(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_standin_artifact(tiny_checkpoint, tmp_path_factory.mktemp("guards") / "artifact")


def test_int8_on_vllm_033_sets_the_marlin_variable(artifact, tmp_path):
    code, doc, err, _ = dry_run(artifact, tmp_path, "one-gpu", "--activations", "int8", version="0.33.0")
    assert code == 0, err
    assert doc["env"][VAR] == "int8" and "--quantization" not in doc["command"]
    assert doc["compat"]["version"] == "0.33.0" and doc["compat"]["build"] == "cuda"


def test_int8_on_vllm_034_is_refused_and_the_variable_never_passed(artifact, tmp_path):
    code, doc, err, _ = dry_run(artifact, tmp_path, "one-gpu", "--activations", "int8", version="0.34.0")
    assert code == 7, err
    assert VAR not in doc["env"] and "--quantization" not in doc["command"]
    first = doc["failures"][0]["message"]
    assert first.startswith("--activations int8: vLLM >=0.34.0 refuses to start with VLLM_MARLIN_INPUT_DTYPE set")
    assert "leaves lm_head unquantized" in first and first in err


def test_bf16_on_vllm_034_removes_the_shell_variable(artifact, tmp_path):
    env, launcher, _ = machine_env(tmp_path, "one-gpu", "0.34.0")
    r = subprocess.run(
        serve_argv(artifact, launcher, "--dry-run", port=str(free_port())),
        env=env | {VAR: "int8"},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"env -u {VAR} ") and f"{VAR}=" not in r.stdout


@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
def test_pipeline_with_mtp_is_refused_unless_mtp_is_off(artifact, tmp_path, version):
    code, doc, err, _ = dry_run(
        artifact, tmp_path, "two-gpus-nvlink", "--split", "pipeline", "-p", "single-user", version=version
    )
    assert code == 7, err
    assert "with profile single-user, which drafts with MTP" in doc["failures"][0]["message"]
    assert "RFC #44697" in doc["failures"][0]["message"] and "--speculative-config null" in doc["failures"][0]["hint"]
    code, doc, err, _ = dry_run(
        artifact,
        tmp_path,
        "two-gpus-nvlink",
        "--split",
        "pipeline",
        "-p",
        "single-user",
        version=version,
        extra=("--speculative-config", "null"),
    )
    assert code == 0, err
    assert doc["layout"]["pipeline"] == 2 and "--speculative-config" in doc["command"]


def test_the_automatic_layout_picks_tensor_for_mtp(artifact, tmp_path):
    """PCIe without peer-to-peer: pipeline for a profile without MTP, tensor (and why) for one with it."""
    code, doc, err, _ = dry_run(artifact, tmp_path, "two-gpus-pcie-no-p2p", "-p", "single-user")
    assert code == 0, err
    assert doc["layout"]["tensor"] == 2 and "the profile drafts with MTP" in doc["layout"]["reason"]
    code, doc, err, _ = dry_run(artifact, tmp_path, "two-gpus-pcie-no-p2p", "-p", "batch")
    assert code == 0 and doc["layout"]["pipeline"] == 2


def test_prefix_caching_with_mtp_is_warned(artifact, tmp_path):
    code, doc, err, _ = dry_run(artifact, tmp_path, "one-gpu", "-p", "single-user", extra=("--enable-prefix-caching",))
    assert code == 0, err
    assert any("--enable-prefix-caching with MTP drafting" in w and "vllm #53912" in w for w in doc["warnings"])
    code, doc, err, _ = dry_run(artifact, tmp_path, "one-gpu", "-p", "batch", extra=("--enable-prefix-caching",))
    assert code == 0 and not any("#53912" in w for w in doc["warnings"])


def test_pipeline_on_the_cpu_build_is_refused(artifact, tmp_path):
    code, doc, err, _ = dry_run(artifact, tmp_path, "cpu-avx512", "--gpus", "2", "--split", "pipeline", "-p", "batch")
    assert code == 2, err
    assert "Not enough allowed NUMA nodes" in doc["failures"][0]["message"]
    code, doc, err, _ = dry_run(artifact, tmp_path, "cpu-avx512", "--gpus", "2", "--split", "tensor", "-p", "batch")
    assert code == 2 and "needs a CUDA vLLM build" in doc["failures"][0]["message"]


def test_split_needs_gpus(artifact, tmp_path):
    env, launcher, _ = machine_env(tmp_path, "one-gpu")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "qwenquant",
            "serve",
            str(artifact),
            "--vllm",
            str(launcher),
            "--split",
            "pipeline",
            "--dry-run",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2
    assert "--split needs --gpus N" in flat(r.stderr)


def test_a_stage_without_layers_is_refused(artifact, tmp_path):
    env, launcher, _ = machine_env(tmp_path, "two-gpus-nvlink")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "qwenquant",
            "serve",
            str(artifact),
            "--vllm",
            str(launcher),
            "--device",
            "cuda",
            "--gpus",
            "2",
            "--split",
            "pipeline",
            "-p",
            "batch",
            "--dry-run",
            "--",
            "--max-model-len",
            "2048",
        ],
        env=env | {"VLLM_PP_LAYER_PARTITION": "4,0"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    assert "VLLM_PP_LAYER_PARTITION=4,0" in flat(r.stderr) and "no layers" in flat(r.stderr)


@pytest.mark.parametrize("kernel, code", [("MarlinLinearKernel", None), ("MacheteLinearKernel", 7)])
def test_int8_read_back_from_the_log(artifact, tmp_path, kernel, code):
    """A real start (the stand-in vLLM) with --activations int8: ready when the log names Marlin for the W4A16
    layers, exit 7 naming the line when it names a kernel that takes 16-bit activations."""
    env, launcher, _ = machine_env(tmp_path, "one-gpu")
    log = tmp_path / "server.log"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "qwenquant",
            "serve",
            str(artifact),
            "--vllm",
            str(launcher),
            "--device",
            "cuda",
            "--port",
            str(free_port()),
            "--activations",
            "int8",
            "--timeout",
            "60",
            "--log-file",
            str(log),
            "--",
            "--max-model-len",
            "2048",
            "--standin-mode",
            "good",
            "--standin-kernel",
            kernel,
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline() if code is None else ""
        out, err = proc.communicate(timeout=5) if code is None else proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        out, err = "", ""
    finally:
        if proc.poll() is None:
            proc.send_signal(2)
            proc.communicate(timeout=60)
    if code is None:
        assert line.startswith("ready "), err
    else:
        assert proc.returncode == 7 and "ready" not in out
        assert (
            f"--activations int8 was asked, but vLLM runs {kernel} for CompressedTensorsWNA16 layers, which "
            "takes 16-bit activations"
        ) in flat(err)
        assert f"Using {kernel} for CompressedTensorsWNA16" in flat(err)
    assert os.path.exists(log)


def test_the_dry_run_checks_the_log_file_folder(artifact, tmp_path):
    """The real start writes the server log there; a folder that is a file is refused up front (exit 2), in the dry
    run as in the real start."""
    (tmp_path / "afile").write_text("x")
    code, doc, err, _ = dry_run(artifact, tmp_path, "one-gpu", "--log-file", str(tmp_path / "afile" / "s.log"))
    assert code == 2, err
    assert doc["failures"][0]["message"] == (
        f"the server log {tmp_path / 'afile' / 's.log'} cannot be written: {tmp_path / 'afile'} is not a folder"
    )
    env, launcher, _ = machine_env(tmp_path, "one-gpu")
    r = subprocess.run(
        serve_argv(artifact, launcher, "--log-file", str(tmp_path / "afile" / "s.log"), port=str(free_port())),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "ready" not in r.stdout
    assert f"the server log {tmp_path / 'afile' / 's.log'} cannot be written" in flat(r.stderr)


@pytest.mark.parametrize("cmd", [["serve"], ["bench", "run"], ["eval", "served"], ["plan"]])
def test_profile_help_names_a_profile(cmd):
    """--profile is given once per profile: its help shows PROFILE, not the Python type <list[str]>."""
    r = subprocess.run(
        [sys.executable, "-m", "qwenquant", *cmd, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, COLUMNS="200"),
    )
    assert r.returncode == 0
    line = next(x for x in r.stdout.splitlines() if "--profile" in x and " -p " in x and "│" in x)
    assert "PROFILE" in line and "list[str]" not in line
