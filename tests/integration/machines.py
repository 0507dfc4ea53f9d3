"""The machine fixtures of the launch tests: one GPU, two on NVLink, two on PCIe without peer-to-peer, vLLM's CPU
build on a CPU without AVX-512 and on one with it, each as the environment `qwenquant serve` runs in, and a dry run
on one of them.

STAND-INS (no GPU here): nvidia-smi is a script (tests/helpers.py fake_nvidia_smi) printing fixed GPUs, compute
capability and link matrices, and logging each call; vLLM is tests/integration/standin.py's launcher and stub
package (its version and its CPU's AVX-512 chosen per machine). A dry run starts nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from standin import serve_env, write_fake_vllm

from helpers import NV4_2, P2P_CNS, PHB_2, fake_nvidia_smi, flat

ONE = ["0, GPU-aaaa, 24576, 24000"]
TWO = ["0, GPU-aaaa, 24576, 24000", "1, GPU-bbbb, 24576, 23900"]
# machine -> (device, GPU rows, compute capability, topo -m, topo -p2p r, CPU with AVX-512, serve options); the
# CUDA machines run vLLM 0.33.0 (scripts/install-vllm.sh's), the CPU ones the CPU build's 0.32.0
MACHINES: dict[str, tuple[str, list[str], str, str, str, bool, tuple[str, ...]]] = {
    "one-gpu": ("cuda", ONE, "8.6", "", "", True, ()),
    "two-gpus-nvlink": ("cuda", TWO, "8.6", NV4_2, "", True, ("--gpus", "2")),
    "two-gpus-pcie-no-p2p": ("cuda", TWO, "8.6", PHB_2, P2P_CNS, True, ("--gpus", "2")),
    "cpu-no-avx512": ("cpu", [], "", "", "", False, ()),
    "cpu-avx512": ("cpu", [], "", "", "", True, ()),
}


def machine_env(tmp_path: Path, name: str, version: str | None = None) -> tuple[dict[str, str], Path, Path]:
    """(environment, the stand-in vLLM's launcher, the stand-in nvidia-smi's folder) of one machine fixture."""
    device, rows, cap, topo, p2p, avx512, _ = MACHINES[name]
    version = version or ("0.32.0" if device == "cpu" else "0.33.0")
    tmp_path = tmp_path / f"run{len(list(tmp_path.glob('run*')))}"  # each call its own stand-ins and call log
    tmp_path.mkdir()
    launcher = write_fake_vllm(tmp_path / "vllm", version=version, avx512=avx512)
    env = serve_env(launcher, tmp_path)
    for k in (
        "CUDA_VISIBLE_DEVICES",
        "VLLM_PP_LAYER_PARTITION",
        "VLLM_MARLIN_INPUT_DTYPE",
        "VLLM_DISABLED_KERNELS",
        "VLLM_CPU_KVCACHE_SPACE",
        "QWENQUANT_VLLM_CPU_W4A16",
    ):
        env.pop(k, None)
    smi = fake_nvidia_smi(tmp_path, rows, cap=cap or "8.6", topo=topo, p2p=p2p)
    if device == "cpu":  # no NVIDIA driver on a CPU machine
        (smi / "nvidia-smi").unlink()
    env["PATH"] = f"{smi}{os.pathsep}{env['PATH']}"
    return env, launcher, smi


def serve_argv(
    artifact: Path, launcher: Path, *opts: str, device: str = "cuda", port: str = "18123", after: tuple[str, ...] = ()
) -> list[str]:
    """`qwenquant serve ARTIFACT` on the stand-in launcher: OPTS, then after `--` a 2048-token context and AFTER."""
    return [
        sys.executable, "-m", "qwenquant", "serve", str(artifact), "--vllm", str(launcher), "--device", device,
        "--port", port, *opts, "--", "--max-model-len", "2048", *after,
    ]  # fmt: skip


def dry_run(
    artifact: Path, tmp_path: Path, name: str, *opts: str, version: str | None = None, extra: tuple[str, ...] = ()
) -> tuple[int, dict[str, Any] | None, str, Path]:
    """(exit code, the --json document, stderr, the stand-in nvidia-smi's folder) of `serve --dry-run --json`."""
    env, launcher, smi = machine_env(tmp_path, name, version)
    device, *_, serve_opts = MACHINES[name]
    r = subprocess.run(
        serve_argv(artifact, launcher, "--dry-run", "--json", *serve_opts, *opts, device=device, after=extra),
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    try:
        doc = json.loads(r.stdout)
    except ValueError:
        doc = None
    return r.returncode, doc, flat(r.stderr), smi
