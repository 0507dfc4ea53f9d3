"""`qwenquant bench --depth` against the stand-in (tests/integration/standin_long.py): the ladder,
its prompt fitting and each way a rung fails. STAND-IN, not vLLM: no real vLLM fails at a chosen
depth, stalls, or prints an out-of-memory line on demand (the real vLLM CPU server's ladder is in
test_bench_long_vllm.py). Served as a URL in the test process, or as vLLM under `--serve` (the
out-of-memory line in the server log and the server's death need the supervisor)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from standin import build_standin_artifact, serve_env
from standin_long import LongStandin, write_long_vllm

from helpers import flat


def _bench(tmp: Path, *args: str, env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp / "depth.json"
    r = subprocess.run(
        [sys.executable, "-m", "qwenquant", "bench", "depth", "--out", str(out), *args],
        env=env or {**os.environ, "QWENQUANT_NO_PROGRESS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    return r, out


def _errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]  # the CLI's error line is never wrapped


def test_ladder_doubles_to_the_limit_with_fresh_prompts(tmp_path: Path) -> None:
    with LongStandin() as s:
        s.max_model_len = 8192
        r, out = _bench(tmp_path, s.url, "--max-tokens", "32")
        bodies = list(s.bodies)
    assert r.returncode == 0, r.stderr
    rep = json.loads(out.read_text())
    # the stand-in drafts 3 tokens (its /metrics lists 3 positions): the top rung leaves them free
    assert rep["depths"] == [1024, 2048, 4096, 8192 - 32 - 3] and rep["draft_tokens"] == 3
    assert rep["max_model_len"] == 8192 and rep["tokenize"] is True
    for rung in rep["rungs"]:  # counted by the server, never above the rung, at most 0.1% below
        assert rung["ok"] and rung["depth"] * 0.999 <= rung["prompt_tokens"] <= rung["depth"], rung
        assert rung["completion_tokens"] == 32 and rung["decode_tok_s"] > 0 and rung["prefill_tok_s"] > 0
        assert rung["acceptance"]["per_position"][:2] == pytest.approx([1.0, 1.0], abs=0.1)
        assert rung["gpu_memory"] == {"sampled": False, "why": "not sampled: nvidia-smi not found"}
    firsts = [b["messages"][0]["content"].splitlines()[0] for b in bodies]
    assert len(set(firsts)) == 4 and all(rep["nonce"] in f for f in firsts)  # no shared prefix across rungs
    assert rep["last_ok_depth"] == rep["rungs"][-1]["prompt_tokens"] and rep["failure"] is None
    assert rep["text"]["license"] == "PSF-2.0" and "argparse" in bodies[0]["messages"][0]["content"]
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "deepest prompt that worked: 8" in flat(r.stderr) and "prefill tok/s" in r.stdout


def test_reuse_prefix_and_chosen_depths_without_tokenize(tmp_path: Path) -> None:
    """No /tokenize: the first rung falls short, later ones use the characters per token the server counted."""
    with LongStandin() as s:
        s.tokenize, s.chars_per_token = False, 3.0
        r, out = _bench(tmp_path, s.url, "--depths", "1000,3000,4000", "--reuse-prefix")
        bodies = list(s.bodies)
    assert r.returncode == 0, r.stderr
    rep = json.loads(out.read_text())
    got = [x["prompt_tokens"] for x in rep["rungs"]]
    assert rep["tokenize"] is False and got[0] < 1000
    assert 0.95 * 3000 <= got[1] <= 3000 and 0.95 * 4000 <= got[2] <= 4000, got
    texts = [b["messages"][0]["content"] for b in bodies]
    assert texts[1].startswith(texts[0][: -len("Continue the Python source above.") - 2][:2000])


@pytest.mark.parametrize(
    ("mode", "says"),
    [("http", "answered 500"), ("stall", "stalled: no token from the server"), ("empty", "empty output")],
)
def test_a_failing_rung_ends_the_ladder(tmp_path: Path, mode: str, says: str) -> None:
    with LongStandin() as s:
        s.max_model_len, s.fail_depth, s.fail_mode = 8192, 3000, mode
        r, out = _bench(tmp_path, s.url, "--stall-timeout", "2")
    assert r.returncode == 8, r.stderr
    errors = _errors(r.stderr)
    assert len(errors) == 1 and "the depth ladder failed at 4096 tokens" in errors[0] and says in errors[0], r.stderr
    assert "last depth that worked: 204" in errors[0]
    rep = json.loads(out.read_text())
    assert [x["ok"] for x in rep["rungs"]] == [True, True, False] and rep["failure"]["depth"] == 4096
    assert out.with_suffix(".png").exists() and "FAILED" in r.stdout


def test_depths_beyond_the_limit_are_a_usage_error(tmp_path: Path) -> None:
    with LongStandin() as s:
        s.max_model_len = 2048
        r, _ = _bench(tmp_path, s.url, "--depths", "1024,2048")
    assert r.returncode == 2 and "--depths 2048 plus 64 output tokens exceeds the server's max_model_len 2048" in flat(
        r.stderr
    )


@pytest.fixture(scope="module")
def served(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("depthserve")
    return {
        "artifact": build_standin_artifact(tiny_checkpoint, root / "artifact"),
        "launcher": write_long_vllm(root / "fakevllm"),
    }


@pytest.mark.parametrize(
    ("mode", "says"),
    [
        ("oom", "the server log says: torch.OutOfMemoryError: CUDA out of memory"),
        ("die", "the server process exited with code 3"),
    ],
)
def test_served_oom_line_or_death_ends_the_ladder(
    served: dict[str, Path], tmp_path: Path, mode: str, says: str
) -> None:
    env = serve_env(served["launcher"], tmp_path)
    r, out = _bench(
        tmp_path,
        "--serve",
        str(served["artifact"]),
        "--vllm",
        str(served["launcher"]),
        "--timeout",
        "60",
        "--",
        "--max-model-len",
        "4096",
        "--standin-max-model-len",
        "4096",
        "--standin-fail-depth",
        "2000",
        "--standin-fail-mode",
        mode,
        env=env,
    )
    assert r.returncode == 8, r.stderr[-3000:]
    errors = _errors(r.stderr)
    assert len(errors) == 1 and "failed at 2048 tokens" in errors[0] and says in errors[0], r.stderr[-3000:]
    assert "last depth that worked: 102" in errors[0]
    rep = json.loads(out.read_text())
    assert rep["target"]["server_log"] and rep["failure"]["depth"] == 2048
