"""The host-embeddings vLLM plugin (scripts/vllm-host-embeddings/plugin), against the vLLM that
scripts/install-vllm.sh installed (the CPU build here): its decisions are asked of vLLM's own classes,
and its refusal is what a real vLLM start prints.

- Which layers move: a plain `VocabParallelEmbedding` does, vLLM's `ParallelLMHead` (its subclass, whose
  whole matrix every token reads) does not; both are built by vLLM's own constructors.
- The platform guard: vLLM's CPU build has no device memory to save; the plugin names the CUDA requirement,
  and a real server started with QWENQUANT_HOST_EMBEDDINGS=1 on the tiny artifact stops with that line.
- The switch takes 0 or 1 only, and without it the plugin changes nothing (vLLM's class is not wrapped).
The UVA path itself needs a CUDA GPU and is not exercised here.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from helpers import require_vllm

REPO = Path(__file__).resolve().parents[2]
INFO = REPO / ".venv-vllm" / "qwenquant-vllm.json"

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def _probe(python: str, switch: str | None) -> dict:
    code = (
        "import json\n"
        "from importlib.metadata import entry_points\n"
        "import qwenquant_vllm_hostembed as plugin\n"
        "from vllm.model_executor.layers import vocab_parallel_embedding as vpe\n"
        "out = {'entry_point': 'qwenquant_host_embeddings' in "
        "{e.name for e in entry_points(group='vllm.general_plugins')}}\n"
        "try:\n"
        "    out['enabled'] = plugin.enabled()\n"
        "except ValueError as e:\n"
        "    out['enabled_error'] = str(e)\n"
        "out['moves_embedding'] = plugin.moves(vpe.VocabParallelEmbedding(256, 64, disable_tp=True))\n"
        "out['moves_lm_head'] = plugin.moves(vpe.ParallelLMHead(256, 64, disable_tp=True))\n"
        "out['problem'] = plugin.platform_problem()\n"
        "if out.get('enabled') is False:\n"
        "    plugin.register()\n"
        "    out['wrapped'] = bool(getattr(vpe.VocabParallelEmbedding, '_qwenquant_host_wrapped', False))\n"
        "print('PROBE ' + json.dumps(out))\n"
    )
    env = dict(os.environ)
    env.pop("QWENQUANT_HOST_EMBEDDINGS", None)
    if switch is not None:
        env["QWENQUANT_HOST_EMBEDDINGS"] = switch
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("PROBE "))
    return json.loads(line.removeprefix("PROBE "))


@pytest.fixture(scope="module")
def vllm_info() -> dict:
    require_vllm(INFO, f"the vLLM environment ({INFO})")
    return json.loads(INFO.read_text())


def test_the_plugin_is_registered_and_moves_the_embedding_not_the_head(vllm_info: dict) -> None:
    out = _probe(vllm_info["python"], None)
    assert out["entry_point"] is True
    assert out["moves_embedding"] is True
    assert out["moves_lm_head"] is False
    assert out["enabled"] is False and out["wrapped"] is False  # off: vLLM's class untouched


def test_the_switch_takes_0_or_1_and_the_cpu_build_is_refused(vllm_info: dict) -> None:
    out = _probe(vllm_info["python"], "yes")
    assert out["enabled_error"] == "QWENQUANT_HOST_EMBEDDINGS='yes': expected 0 or 1"
    if vllm_info["device"] == "cpu":
        assert out["problem"] == "QWENQUANT_HOST_EMBEDDINGS=1 needs a CUDA GPU; this vLLM runs on cpu"
