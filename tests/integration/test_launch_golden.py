"""The launch plan `qwenquant serve --dry-run --json` prints, held against golden files for five machines: one GPU,
two GPUs on NVLink, two on PCIe without peer-to-peer, vLLM's CPU build on a CPU without AVX-512 and on one with it;
for each, the argv, the environment vLLM gets (added and removed), the warnings, the notes and the parallel layout
of the tiny stand-in artifact under two profiles (single-user drafts with MTP, batch does not). Refresh the files
with QWENQUANT_UPDATE_GOLDEN=1 after a change of behaviour meant to show here. Also: how often one command runs
nvidia-smi.

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

import pytest
from standin import build_standin_artifact, serve_env, write_fake_vllm

from helpers import NV4_2, P2P_CNS, PHB_2, fake_nvidia_smi, flat, smi_calls

GOLDEN = Path(__file__).resolve().parents[1] / "unit" / "golden"
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
PROFILES = ("single-user", "batch")


@pytest.fixture(scope="module")
def artifact(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_standin_artifact(tiny_checkpoint, tmp_path_factory.mktemp("golden") / "artifact")


def machine_env(tmp_path: Path, name: str, version: str | None = None) -> tuple[dict[str, str], Path, Path]:
    """(environment, the stand-in vLLM's launcher, the stand-in nvidia-smi's folder) of one machine fixture."""
    device, rows, cap, topo, p2p, avx512, _ = MACHINES[name]
    version = version or ("0.32.0" if device == "cpu" else "0.33.0")
    tmp_path = tmp_path / f"run{len(list(tmp_path.glob('run*')))}"  # each call its own stand-ins and call log
    tmp_path.mkdir()
    launcher = write_fake_vllm(tmp_path / "vllm", version=version, avx512=avx512)
    env = serve_env(launcher, tmp_path)
    for k in ("CUDA_VISIBLE_DEVICES", "VLLM_PP_LAYER_PARTITION", "VLLM_MARLIN_INPUT_DTYPE", "VLLM_DISABLED_KERNELS",
              "VLLM_CPU_KVCACHE_SPACE", "QWENQUANT_VLLM_CPU_W4A16"):
        env.pop(k, None)
    smi = fake_nvidia_smi(tmp_path, rows, cap=cap or "8.6", topo=topo, p2p=p2p)
    if device == "cpu":  # no NVIDIA driver on a CPU machine
        (smi / "nvidia-smi").unlink()
    env["PATH"] = f"{smi}{os.pathsep}{env['PATH']}"
    return env, launcher, smi


def dry_run(artifact: Path, tmp_path: Path, name: str, *opts: str, version: str | None = None,
            extra: tuple[str, ...] = ()) -> tuple[int, dict[str, Any] | None, str, Path]:
    """(exit code, the --json document, stderr, the stand-in nvidia-smi's folder) of `serve --dry-run --json`."""
    env, launcher, smi = machine_env(tmp_path, name, version)
    device, *_, serve_opts = MACHINES[name]
    r = subprocess.run([sys.executable, "-m", "qwenquant", "serve", str(artifact), "--vllm", str(launcher),
                        "--device", device, "--port", "18123", "--dry-run", "--json", *serve_opts, *opts,
                        "--", "--max-model-len", "2048", *extra], env=env, capture_output=True, text=True, timeout=180)
    try:
        doc = json.loads(r.stdout)
    except ValueError:
        doc = None
    return r.returncode, doc, flat(r.stderr), smi


def _layout(command: list[str], notes: list[str]) -> dict[str, Any]:
    def size(flag: str) -> int:
        return int(command[command.index(flag) + 1]) if flag in command else 1

    split = [n for n in notes if n.startswith("split over ")]
    return {"tensor": size("--tensor-parallel-size"), "pipeline": size("--pipeline-parallel-size"),
            "reason": split[0] if split else None}


def projection(doc: dict[str, Any], artifact: Path, launcher_python: str) -> dict[str, Any]:
    """What the golden file holds: the plan with this run's paths replaced by placeholders."""
    def clean(text: str) -> str:
        return (text.replace(str(artifact.resolve()), "<ARTIFACT>").replace(launcher_python, "<PYTHON>")
                .replace(str(Path(__file__).resolve().parent), "<TESTS>"))

    command = [clean(a) for a in doc["command"]]
    return {"command": command, "env": {k: clean(v) for k, v in sorted(doc["env"].items())},
            "env_unset": doc["env_unset"], "activations": doc["activations"],
            "warnings": [clean(w) for w in doc["warnings"]], "notes": [clean(n) for n in doc["notes"]],
            "layout": _layout(command, doc["notes"]), "failures": [clean(f["message"]) for f in doc["failures"]]}


def check_golden(name: str, got: dict[str, Any]) -> None:
    path = GOLDEN / f"launch-{name}.json"
    text = json.dumps(got, indent=2, sort_keys=True) + "\n"
    if os.environ.get("QWENQUANT_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert path.exists(), f"no golden file {path}: run with QWENQUANT_UPDATE_GOLDEN=1 once"
    assert json.loads(path.read_text()) == got, f"{path.name} differs (QWENQUANT_UPDATE_GOLDEN=1 refreshes it)"


@pytest.mark.parametrize("machine", list(MACHINES))
def test_launch_plan_per_machine(artifact, tmp_path, machine):
    plans = {}
    for profile in PROFILES:
        code, doc, err, _ = dry_run(artifact, tmp_path, machine, "--profile", profile)
        assert doc is not None, err
        plans[profile] = projection(doc, artifact, sys.executable) | {"exit_code": code}
    check_golden(machine, plans)


@pytest.mark.parametrize("machine, most", [("one-gpu", 1), ("two-gpus-pcie-no-p2p", 3), ("cpu-avx512", 0)])
def test_nvidia_smi_runs_each_query_once(artifact, tmp_path, machine, most):
    """One dry run that needs every GPU fact (the free memory of each GPU, the compute capability for int8 and the
    SM 9.0 rule, the hard --gpu-mem's ballast, the link for the automatic split) asks nvidia-smi each thing once:
    one `--query-gpu` for the GPUs, and `topo -m` / `topo -p2p r` only when the split is read from the link."""
    code, doc, err, smi = dry_run(artifact, tmp_path, machine, "--profile", "batch", "--activations", "int8",
                                  *(("--gpu-mem", "20GiB") if machine != "cpu-avx512" else ()))
    assert doc is not None, err
    calls = smi_calls(smi)
    assert len(calls) == len(set(calls)) and len(calls) <= most, calls
