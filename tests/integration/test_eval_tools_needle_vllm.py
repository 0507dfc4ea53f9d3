"""`qwenquant eval --served URL --tools / --needle` end to end against the real vLLM (CPU build from
.venv-vllm) serving the quantized tiny `constant` model through `qwenquant serve` (one server for
the module). vLLM runs with the profile's tool-call parser and strict level; the tiny model cannot
call tools or retrieve a code, so the tools gate sees plain answers (a pass) and the needle task
fails at every depth (exit 8, the depths named): the test proves the mechanism and the server-side
counting, the stand-in tests (test_eval_tools_needle.py) prove each verdict.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from qwenquant.net.ports import free_port

from helpers import LAUNCHER, ServedCLI, flat, quantize_tiny_artifact, require_vllm, vllm_env

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    require_vllm(LAUNCHER, ".venv-vllm")
    tmp = tmp_path_factory.mktemp("toolsneedle")
    art = quantize_tiny_artifact(tmp, "constant", "text-only")
    args = [str(art), "--profile", "single-user", "--port", str(free_port()), "--vllm", str(LAUNCHER), "--timeout",
            "900", "--", "--max-model-len", "2048"]
    with ServedCLI(*args, env=vllm_env(tmp)) as s:
        yield s


def _eval(url: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "qwenquant", "eval", "--served", url, "--gate", "none", "--json",
                           *extra], capture_output=True, text=True, timeout=900, cwd=REPO)


def test_tool_calling_is_on_and_every_answer_is_well_formed(server) -> None:
    starting = next(ln for ln in server.stderr.splitlines() if "starting:" in ln)
    assert "--enable-auto-tool-choice --tool-call-parser qwen3_coder --tool-strict-level parameter" in flat(starting)
    proc = _eval(server.url, "--tools")
    assert proc.returncode == 0, proc.stderr[-3000:]
    cases = json.loads(proc.stdout)["tools"]["cases"]
    assert [c["name"] for c in cases] == ["no-argument", "required-argument", "nested-json"]
    assert all(c["kind"] in ("answer", "tool_call") and c["ok"] for c in cases), cases


def test_needle_runs_to_the_promised_context_counted_by_the_server(server) -> None:
    proc = _eval(server.url, "--needle")
    assert proc.returncode == 8, proc.stderr[-3000:]
    rep = json.loads(proc.stdout)["needle"]
    assert rep["max_model_len"] == 2048 and rep["limit"] == 2048 - 24
    rows = rep["depths"]
    assert [r["depth"] for r in rows] == [0.1, 0.5, 0.9] * 2  # 1024, then 2024 tokens
    for r, target in zip(rows, [1024] * 3 + [2024] * 3, strict=True):
        assert target - 64 <= r["prompt_tokens"] <= target, r  # vLLM's own usage.prompt_tokens
        assert 0 < r["needle_tokens"] < r["prompt_tokens"] and "error" not in r, r
    assert not any(r["passed"] for r in rows)  # the constant model answers " the the ..."
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and errors[0].count("needle at depth") == 6
