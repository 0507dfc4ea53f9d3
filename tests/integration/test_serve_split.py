"""`qwenquant serve --gpus 2` picks tensor or pipeline parallelism from the GPUs' link and prints
the choice with its reason; `--split` and vLLM's own flags after `--` decide instead; `--dry-run`
shows the argv.

STAND-INS (no GPU here): nvidia-smi is a script printing two idle 24 GiB GPUs and, for `topo -m`
and `topo -p2p r`, the matrices of tests/helpers.py; vLLM is the stand-in launcher
of tests/integration/standin.py (a dry run starts nothing).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from standin import build_standin_artifact, serve_env, write_fake_vllm

from qwenquant.net.ports import free_port

from helpers import NV4_2, P2P_CNS, PHB_2, fake_nvidia_smi, flat

TWO = ["0, GPU-aaaa, 24576, 24000", "1, GPU-bbbb, 24576, 23900"]


@pytest.fixture(scope="module")
def setup(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("split")
    return {
        "artifact": build_standin_artifact(tiny_checkpoint, root / "artifact"),
        "launcher": write_fake_vllm(root / "fakevllm"),
    }


def _dry_run(setup: dict[str, Path], tmp_path: Path, topo: str, p2p: str, *opts: str) -> tuple[int, str, str]:
    env = serve_env(setup["launcher"], tmp_path)
    env["PATH"] = f"{fake_nvidia_smi(tmp_path, TWO, topo=topo, p2p=p2p)}{os.pathsep}{env['PATH']}"
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env.pop("VLLM_PP_LAYER_PARTITION", None)
    before, after = (
        (list(opts[: opts.index("--")]), list(opts[opts.index("--") :])) if "--" in opts else (list(opts), [])
    )
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "qwenquant",
            "serve",
            str(setup["artifact"]),
            "--vllm",
            str(setup["launcher"]),
            "--device",
            "cuda",
            "--port",
            str(free_port()),
            "--gpus",
            "2",
            "--dry-run",
            *before,
            *(after or ["--"]),
            "--max-model-len",
            "2048",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return r.returncode, r.stdout, flat(r.stderr)


def test_pcie_without_p2p_serves_pipeline(setup, tmp_path):
    code, out, err = _dry_run(setup, tmp_path, PHB_2, P2P_CNS, "--profile", "batch")
    assert code == 0, err
    assert "--pipeline-parallel-size 2" in out and "--tensor-parallel-size" not in out
    assert (
        "split over 2 GPUs: pipeline parallelism (GPU 0 and GPU 1 are linked by PCIe (PHB) without "
        "peer-to-peer (peer-to-peer read CNS)"
    ) in err


def test_pcie_without_p2p_serves_tensor_for_mtp(setup, tmp_path):
    """single-user drafts with MTP, which vLLM does not run under pipeline parallelism: tensor, and both reasons."""
    code, out, err = _dry_run(setup, tmp_path, PHB_2, P2P_CNS)
    assert code == 0, err
    assert "--tensor-parallel-size 2" in out and "--pipeline-parallel-size" not in out
    assert (
        "split over 2 GPUs: tensor parallelism (the profile drafts with MTP, which vLLM does not support under "
        "pipeline parallelism (RFC #44697); the link alone would pick pipeline: GPU 0 and GPU 1"
    ) in err


def test_nvlink_serves_tensor(setup, tmp_path):
    code, out, err = _dry_run(setup, tmp_path, NV4_2, "")
    assert code == 0, err
    assert "--tensor-parallel-size 2" in out and "--pipeline-parallel-size" not in out
    assert "split over 2 GPUs: tensor parallelism (NVLink between every pair of GPUs (NV4))" in err


@pytest.mark.parametrize(
    "opts, flag, reason",
    [
        (("--split", "tensor"), "--tensor-parallel-size 2", "(--split tensor)"),
        (("--", "-tp", "2"), "-tp 2", "(the vLLM flags after --)"),
    ],
)
def test_the_command_line_decides_over_the_link(setup, tmp_path, opts, flag, reason):
    code, out, err = _dry_run(setup, tmp_path, PHB_2, P2P_CNS, *opts)
    assert code == 0, err
    assert flag in out and "--pipeline-parallel-size" not in out
    assert f"split over 2 GPUs: tensor parallelism {reason}" in err


def test_unreadable_link_keeps_tensor(setup, tmp_path):
    code, out, err = _dry_run(setup, tmp_path, "", "")
    assert code == 0, err
    assert "--tensor-parallel-size 2" in out
    assert "the GPUs' link could not be read from `nvidia-smi topo -m`; pass --split to choose" in err
