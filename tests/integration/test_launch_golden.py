"""The launch plan `qwenquant serve --dry-run --json` prints, held against golden files for five machines: one GPU,
two GPUs on NVLink, two on PCIe without peer-to-peer, vLLM's CPU build on a CPU without AVX-512 and on one with it;
for each, the argv, the environment vLLM gets (added and removed), the warnings, the notes and the parallel layout
of the tiny stand-in artifact under two profiles (single-user drafts with MTP, batch does not). Refresh the files
with QWENQUANT_UPDATE_GOLDEN=1 after a change of behaviour meant to show here. Also: how often one command runs
nvidia-smi.

STAND-INS (no GPU here): the machines of tests/integration/machines.py (a stand-in nvidia-smi that logs its calls,
the stand-in vLLM of tests/integration/standin.py with a chosen version). A dry run starts nothing.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from machines import MACHINES, dry_run
from standin import build_standin_artifact

from helpers import smi_calls

GOLDEN = Path(__file__).resolve().parents[1] / "unit" / "golden"
PROFILES = ("single-user", "batch")  # the one that drafts with MTP, the one that does not


@pytest.fixture(scope="module")
def artifact(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_standin_artifact(tiny_checkpoint, tmp_path_factory.mktemp("golden") / "artifact")


def _layout(command: list[str], notes: list[str]) -> dict[str, Any]:
    def size(flag: str) -> int:
        return int(command[command.index(flag) + 1]) if flag in command else 1

    split = [n for n in notes if n.startswith("split over ")]
    return {
        "tensor": size("--tensor-parallel-size"),
        "pipeline": size("--pipeline-parallel-size"),
        "reason": split[0] if split else None,
    }


def projection(doc: dict[str, Any], artifact: Path, launcher_python: str) -> dict[str, Any]:
    """What the golden file holds: the plan with this run's paths replaced by placeholders."""

    def clean(text: str) -> str:
        return (
            text.replace(str(artifact.resolve()), "<ARTIFACT>")
            .replace(launcher_python, "<PYTHON>")
            .replace(str(Path(__file__).resolve().parent), "<TESTS>")
        )

    command = [clean(a) for a in doc["command"]]
    return {
        "command": command,
        "env": {k: clean(v) for k, v in sorted(doc["env"].items())},
        "env_unset": doc["env_unset"],
        "activations": doc["activations"],
        "warnings": [clean(w) for w in doc["warnings"]],
        "notes": [clean(n) for n in doc["notes"]],
        "layout": _layout(command, doc["notes"]),
        "failures": [clean(f["message"]) for f in doc["failures"]],
    }


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
    code, doc, err, smi = dry_run(
        artifact,
        tmp_path,
        machine,
        "--profile",
        "batch",
        "--activations",
        "int8",
        *(("--gpu-mem", "20GiB") if machine != "cpu-avx512" else ()),
    )
    assert doc is not None, err
    calls = smi_calls(smi)
    assert len(calls) == len(set(calls)) and len(calls) <= most, calls
