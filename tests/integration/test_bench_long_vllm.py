"""`qwenquant bench --depth` and `--soak` against the real vLLM (CPU build from .venv-vllm) serving
the quantized tiny reference with MTP: one `qwenquant serve` for the module (the per-request
speculative-decoding metrics on), the depth ladder to its max_model_len and a soak of 4096 generated
tokens, read as a user reads them (exit code, JSON, PNG). The context is 6144 tokens, above the tiny
model's 4096 positions (VLLM_ALLOW_LONG_MAX_MODEL_LEN), so the soak's prompt and output fit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from qwenquant.net.ports import free_port
from qwenquant.testbed.tiny import reference_model

from helpers import LAUNCHER, ServedCLI, require_vllm, vllm_env

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
MAX_LEN = 6144
SOAK, WINDOW = 4096, 512


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    require_vllm(LAUNCHER, ".venv-vllm")
    tmp = tmp_path_factory.mktemp("benchlong")
    env = dict(vllm_env(tmp), QWENQUANT_THREADS="2", VLLM_ALLOW_LONG_MAX_MODEL_LEN="1")
    src = reference_model.build_reference_checkpoint(tmp / "source")
    art = tmp / "artifact"
    q = subprocess.run([sys.executable, "-m", "qwenquant", "quantize", str(src), "--source-unverified", "--recipe",
                        "w4a16-int4head", "--calibration", "tiny-reference", "--out", str(art)],
                       env=env, capture_output=True, text=True, timeout=1800)
    assert q.returncode == 0, q.stderr[-3000:]
    with ServedCLI(str(art), "--profile", "single-user", "--port", str(free_port()), "--vllm", str(LAUNCHER),
                   "--timeout", "900", "--log-file", str(tmp / "server.log"), "--", "--max-model-len", str(MAX_LEN),
                   "--per-request-spec-decode-metrics", "detailed", env=env) as cli:
        yield cli, env


def _bench(server, tmp: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    cli, env = server
    out = tmp / "r.json"
    r = subprocess.run([sys.executable, "-m", "qwenquant", "bench", cli.url, *args, "--out", str(out)],
                       env=env, capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stderr[-3000:]
    return r, json.loads(out.read_text())


def test_depth_ladder_to_max_model_len(server, tmp_path: Path) -> None:
    r, rep = _bench(server, tmp_path, "--depth", "--max-tokens", "64")
    assert rep["max_model_len"] == MAX_LEN and rep["depths"] == [1024, 2048, 4096, MAX_LEN - 64]
    assert rep["tokenize"] is True
    for rung in rep["rungs"]:  # the server's own count, at most 0.1% below the rung
        assert rung["ok"] and rung["depth"] * 0.999 <= rung["prompt_tokens"] <= rung["depth"], rung
        assert rung["completion_tokens"] == 64 and rung["prefill_tok_s"] > 0 and rung["decode_tok_s"] > 0
        acc = rung["acceptance"]
        assert acc["speculative"] and len(acc["per_position"]) == 3 and acc["per_position"][0] > 0, acc
    assert rep["last_ok_depth"] == rep["rungs"][-1]["prompt_tokens"] and rep["failure"] is None
    assert Path(rep["png_path"]).read_bytes()[:4] == b"\x89PNG"
    print(r.stdout)


def test_soak_of_4k_tokens_with_mtp_windows(server, tmp_path: Path) -> None:
    r, rep = _bench(server, tmp_path, "--soak", "--soak-tokens", str(SOAK), "--window", str(WINDOW))
    assert rep["source"] == "per-request" and rep["verdict"] == {"status": "ok", "failures": [], "line": None}
    (stream,) = rep["streams"]
    assert stream["completion_tokens"] == SOAK and stream["finish_reason"] == "length" and stream["error"] is None
    wins = rep["windows"]
    assert len(wins) == SOAK // WINDOW and wins[-1]["end"] == SOAK
    for w in wins:  # a verify step belongs to the window of its first token: windows end at most 3 tokens late
        assert w["index"] * WINDOW <= w["start"] < w["index"] * WINDOW + 4 and w["drafts"] > 0
        assert len(w["per_position"]) == 3 and w["per_position"] == sorted(w["per_position"], reverse=True)
    assert sum(w["accepted"] for w in wins) > 0
    assert Path(rep["png_path"]).read_bytes()[:4] == b"\x89PNG"
    print(r.stdout, r.stderr[-1500:], json.dumps(rep["windows"]))
