"""The one fused-layer map (`qwenquant.check.rules.FUSED_PARTS` / `PART_OF`: which checkpoint Linears vLLM loads as
one layer, so they need one scheme, and int8 activations share one scale maximum) is vLLM's own
`packed_modules_mapping` of the Qwen3.5 classes (text-only, multimodal and the MTP drafter), read from .venv-vllm's
python (vLLM is not importable from the quantization environment), as test_plan_pipeline_vllm.py holds the pipeline
split against `get_pp_indices`.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from qwenquant.check.rules import FUSED_PARTS, PART_OF
from qwenquant.evaluate import int8act

from helpers import require_vllm

REPO = Path(__file__).resolve().parents[2]
INFO = REPO / ".venv-vllm" / "qwenquant-vllm.json"

pytestmark = [pytest.mark.vllm]

_CODE = """
import json
from vllm.model_executor.models import qwen3_5, qwen3_5_mtp
classes = {"text": qwen3_5.Qwen3_5ForCausalLM, "multimodal": qwen3_5.Qwen3_5ForConditionalGeneration,
           "mtp": qwen3_5_mtp.Qwen3_5MTP}
print(json.dumps({k: c.packed_modules_mapping for k, c in classes.items()}))
"""


def test_fused_parts_are_vllms_packed_modules_mapping():
    require_vllm(INFO, f"the vLLM environment ({INFO})")
    python = json.loads(INFO.read_text())["python"]
    proc = subprocess.run([python, "-c", _CODE], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    ours = {k: list(v) for k, v in FUSED_PARTS.items()}
    assert got["text"] == ours
    # the multimodal class adds the vision tower's `qkv` (one part, never quantized: nothing to share)
    assert {k: v for k, v in got["multimodal"].items() if v != [k]} == ours
    assert all(ours[k] == v for k, v in got["mtp"].items())  # the drafter's layer fuses as the decoder's
    assert all(int8act.fused_name(f"model.layers.0.mlp.{p}") == f"model.layers.0.mlp.{PART_OF[p]}" for p in PART_OF)
