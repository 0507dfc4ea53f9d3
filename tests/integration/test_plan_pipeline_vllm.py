"""The pipeline split `qwenquant plan --split pipeline` and `serve --split pipeline` plan for is
vLLM's own: `vllm.distributed.utils.get_pp_indices`, called through .venv-vllm's python (vLLM is
not importable from the quantization environment), against `qwenquant.plan.pipeline.stage_ranges`,
with and without VLLM_PP_LAYER_PARTITION. tests/unit/test_plan_pipeline.py pins the same ranges as
literals for the runs without vLLM.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from qwenquant.plan.pipeline import stage_ranges

from helpers import require_vllm

REPO = Path(__file__).resolve().parents[2]
INFO = REPO / ".venv-vllm" / "qwenquant-vllm.json"
CASES = [(64, 2), (64, 4), (65, 4), (66, 4), (67, 4), (63, 2), (8, 3), (64, 3)]

pytestmark = [pytest.mark.vllm]

_CODE = """
import json, sys
from vllm.distributed.utils import get_pp_indices
print(json.dumps([[list(get_pp_indices(n, r, pp)) for r in range(pp)] for n, pp in json.loads(sys.argv[1])]))
"""


def _vllm_splits(cases: list[tuple[int, int]], env: dict[str, str]) -> list[list[tuple[int, int]]]:
    require_vllm(INFO, f"the vLLM environment ({INFO})")
    python = json.loads(INFO.read_text())["python"]
    proc = subprocess.run(
        [python, "-c", _CODE, json.dumps(cases)], capture_output=True, text=True, timeout=300, env=env, cwd=REPO
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [[tuple(r) for r in stages] for stages in json.loads(proc.stdout.strip().splitlines()[-1])]


def test_split_matches_vllms_get_pp_indices():
    env = {k: v for k, v in os.environ.items() if k != "VLLM_PP_LAYER_PARTITION"}
    assert _vllm_splits(CASES, env) == [stage_ranges(n, pp) for n, pp in CASES]


def test_partition_variable_matches_vllms():
    env = {**os.environ, "VLLM_PP_LAYER_PARTITION": "36,28"}
    assert _vllm_splits([(64, 2)], env) == [stage_ranges(64, 2, "36,28")] == [[(0, 36), (36, 64)]]
