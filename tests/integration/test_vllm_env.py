"""The vLLM environment that scripts/install-vllm.sh builds (.venv-vllm) is usable.

No server is started here (the serve tests do that): only that its python imports vLLM and
torchvision, and that the recorded entry point answers --help with --speculative-config.
Skipped when .venv-vllm/qwenquant-vllm.json is absent, except under CI=true, where the vLLM
environment must have been installed and its absence is a failure.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from helpers import require_vllm

REPO = Path(__file__).resolve().parents[2]
INFO = REPO / ".venv-vllm" / "qwenquant-vllm.json"

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


@pytest.fixture(scope="module")
def vllm_info() -> dict:
    require_vllm(INFO, f"the vLLM environment ({INFO})")
    return json.loads(INFO.read_text())


def _run(argv: list[str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=REPO)


def test_info_file_names_an_existing_python_and_the_api_server(vllm_info: dict) -> None:
    assert vllm_info["device"] in ("cpu", "cuda")
    assert Path(vllm_info["python"]).is_file()
    assert vllm_info["entrypoint"][0] == vllm_info["python"]
    assert vllm_info["entrypoint"][1:] == ["-m", "vllm.entrypoints.openai.api_server"]


def test_vllm_python_imports_vllm_and_torchvision(vllm_info: dict) -> None:
    code = (
        "import torch, torchvision, torchvision.ops, vllm\n"
        "import vllm.model_executor.models.qwen3_5\n"
        "b = torch.tensor([[0., 0., 1., 1.], [0., 0., 1., 1.]])\n"
        "print(vllm.__version__, torchvision.ops.nms(b, torch.tensor([.9, .8]), .5).tolist())\n"
    )
    proc = _run([vllm_info["python"], "-c", code])
    assert proc.returncode == 0, proc.stderr[-3000:]
    version, keep = proc.stdout.strip().splitlines()[-1].split(" ", 1)
    assert version == vllm_info["vllm_version"]
    assert keep == "[0]"


def test_entrypoint_help_offers_speculative_config(vllm_info: dict) -> None:
    proc = _run([*vllm_info["entrypoint"], "--help"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "--speculative-config" in proc.stdout
