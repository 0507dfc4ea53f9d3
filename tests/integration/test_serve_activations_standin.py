"""`qwenquant serve --activations int8|bf16` with the stand-in vLLM: the dry-run line and notes on the CPU build
and on faked Ampere, Hopper and Turing GPUs, the environment the server process actually gets, the recipe
profile's opt-in and the flag beating it, and the preflight refusing an artifact that does not qualify.

STAND-INS (no GPU here): nvidia-smi is a script (tests/helpers.py fake_nvidia_smi) printing one idle 24 GiB GPU
of the given compute capability; vLLM is tests/integration/standin.py (it writes the environment it got).
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from standin import build_standin_artifact, serve_env, write_fake_vllm

from qwenquant.net.ports import free_port

from helpers import ServedCLI, fake_nvidia_smi, flat, write_test_manifest

VAR = "VLLM_MARLIN_INPUT_DTYPE"


@pytest.fixture(scope="module")
def setup(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("acts")
    return {
        "artifact": build_standin_artifact(tiny_checkpoint, root / "artifact"),
        "launcher": write_fake_vllm(root / "fakevllm"),
    }


def _env(setup: dict[str, Path], tmp_path: Path, cap: str | None = None, **extra: str) -> dict[str, str]:
    env = serve_env(setup["launcher"], tmp_path)
    env.pop(VAR, None)
    env.pop("VLLM_DISABLED_KERNELS", None)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    if cap is not None:
        env["PATH"] = f"{fake_nvidia_smi(tmp_path, ['0, GPU-aaaa, 24576, 24000'], cap=cap)}{os.pathsep}{env['PATH']}"
    return env | extra


def _dry_run(
    setup: dict[str, Path], env: dict[str, str], *opts: str, artifact: Path | None = None, device: str = "cpu"
) -> tuple[int, str, str]:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "qwenquant",
            "serve",
            str(artifact or setup["artifact"]),
            "--vllm",
            str(setup["launcher"]),
            "--device",
            device,
            "--port",
            str(free_port()),
            "--dry-run",
            *opts,
            "--",
            "--max-model-len",
            "2048",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return r.returncode, r.stdout, flat(r.stderr)


def test_default_is_bf16_and_sets_nothing(setup, tmp_path):
    code, out, err = _dry_run(setup, _env(setup, tmp_path))
    assert code == 0, err
    assert VAR not in out and VAR not in err


def test_int8_on_the_cpu_build_runs_with_a_note(setup, tmp_path):
    code, out, err = _dry_run(setup, _env(setup, tmp_path), "--activations", "int8")
    assert code == 0, err
    assert f"{VAR}=int8 " in out and "VLLM_DISABLED_KERNELS" not in out
    assert (
        "activations: int8 asked (--activations; VLLM_MARLIN_INPUT_DTYPE=int8 set for vLLM), but vLLM's CPU "
        "build has no Marlin kernel: its W4A16 layers run bf16 activations, so the variable has no effect "
        "here"
    ) in err
    code, out, _ = _dry_run(setup, _env(setup, tmp_path), "--activations", "int8", "--json")
    doc = json.loads(out)
    assert doc["activations"] == "int8" and doc["env"][VAR] == "int8" and doc["env_unset"] == []


def test_int8_on_hopper_disables_machete(setup, tmp_path):
    code, out, err = _dry_run(setup, _env(setup, tmp_path, "9.0"), "--activations", "int8", device="cuda")
    assert code == 0, err
    assert f"{VAR}=int8 " in out and "VLLM_DISABLED_KERNELS=MacheteLinearKernel,HummingLinearKernel " in out
    assert "SM 9.0 (Hopper): vLLM chooses Machete for W4A16 layers (vLLM 0.32 also Humming) ahead of Marlin" in err


def test_int8_on_ampere_uses_marlin_as_it_is(setup, tmp_path):
    code, out, err = _dry_run(setup, _env(setup, tmp_path, "8.6"), "--activations", "int8", device="cuda")
    assert code == 0, err
    assert f"{VAR}=int8 " in out and "VLLM_DISABLED_KERNELS" not in out
    assert "SM 8.6: vLLM chooses Marlin for W4A16 layers" in err


def test_int8_on_turing_is_refused(setup, tmp_path):
    code, out, err = _dry_run(setup, _env(setup, tmp_path, "7.5"), "--activations", "int8", device="cuda")
    assert code == 2  # a GPU that cannot do what is asked: the usage code, as in every command
    assert "--activations int8 needs a GPU of SM 8.0 or newer (Marlin's int8 path); this GPU is SM 7.5" in err


def test_bf16_removes_the_shell_variable(setup, tmp_path):
    code, out, err = _dry_run(setup, _env(setup, tmp_path, **{VAR: "int8"}))
    assert code == 0, err
    assert out.startswith(f"env -u {VAR} ") and f"{VAR}=" not in out
    assert f"{VAR}='int8' is set in this shell: removed from vLLM's environment (default bf16)" in err


def _with_profile(setup: dict[str, Path], tmp_path: Path, activations: str) -> Path:
    from qwenquant.recipe import load_recipe

    art = tmp_path / "opted"
    shutil.copytree(setup["artifact"], art)
    recipe = load_recipe("w4a16-int4head").canonical()
    recipe["serve"]["profiles"]["batch"]["activations"] = activations
    write_test_manifest(art, recipe)
    return art


def test_profile_opt_in_and_the_flag_beats_it(setup, tmp_path):
    art = _with_profile(setup, tmp_path, "int8")
    code, out, err = _dry_run(setup, _env(setup, tmp_path), "--profile", "batch", artifact=art)
    assert code == 0, err
    assert f"{VAR}=int8 " in out and "activations: int8 asked (profile batch;" in err
    code, out, err = _dry_run(setup, _env(setup, tmp_path), "--profile", "single-user", artifact=art)
    assert code == 0 and VAR not in out
    code, out, err = _dry_run(setup, _env(setup, tmp_path), "--profile", "batch", "--activations", "bf16", artifact=art)
    assert code == 0 and VAR not in out


def test_the_server_gets_the_variable_and_qwenquant_does_not(setup, tmp_path):
    """int8: the stand-in vLLM's own environment holds VLLM_MARLIN_INPUT_DTYPE=int8; bf16 with the variable in the
    shell: the server's environment lacks it."""
    for acts, shell, want in (("int8", None, "int8"), ("bf16", "int8", None)):
        envfile = tmp_path / f"env-{acts}.json"
        env = _env(setup, tmp_path, **({VAR: shell} if shell else {}))
        args = [
            str(setup["artifact"]),
            "--vllm",
            str(setup["launcher"]),
            "--port",
            str(free_port()),
            "--activations",
            acts,
            "--timeout",
            "60",
            "--log-file",
            str(tmp_path / f"{acts}.log"),
            "--",
            "--max-model-len",
            "2048",
            "--standin-mode",
            "good",
            "--standin-envfile",
            str(envfile),
        ]
        with ServedCLI(*args, env=env, ready_timeout=60):
            got = json.loads(envfile.read_text())
        assert got.get(VAR) == want


def test_preflight_refuses_a_negative_scale(setup, tmp_path):
    from qwenquant.checkpoint.tensorfile import checkpoint_refs

    art = tmp_path / "negative"
    shutil.copytree(setup["artifact"], art)
    ref = next(r for n, r in checkpoint_refs(art).items() if n.endswith("mlp.down_proj.weight_scale"))
    with open(ref.path, "r+b") as f:
        f.seek(ref.start)
        f.write(struct.pack("<f", -1.0)[2:])
    write_test_manifest(art)
    code, _, err = _dry_run(setup, _env(setup, tmp_path), "--activations", "int8", artifact=art)
    assert code == 6
    assert "--activations int8: the artifact does not qualify: " in err and "vllm #48905" in err
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "qwenquant",
            "serve",
            str(art),
            "--vllm",
            str(setup["launcher"]),
            "--activations",
            "int8",
            "--port",
            str(free_port()),
            "--",
            "--max-model-len",
            "2048",
        ],
        env=_env(setup, tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 6 and "ready" not in r.stdout
    assert code == 6 and _dry_run(setup, _env(setup, tmp_path), artifact=art)[0] == 0


@pytest.mark.parametrize("cmd", [["bench", "run"], ["eval", "served"]])
def test_bench_and_eval_take_the_option(cmd):
    r = subprocess.run(
        [sys.executable, "-m", "qwenquant", *cmd, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, COLUMNS="200"),
    )
    assert r.returncode == 0 and "--activations" in r.stdout
