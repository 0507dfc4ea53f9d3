"""`qwenquant bench soak` against the stand-in (tests/integration/standin_long.py): windows from the
per-request metrics and from /metrics scraped at window boundaries, and each verdict seen to fire.
STAND-IN, not vLLM: no real vLLM collapses its acceptance, truncates a stream or restarts on demand
(the real vLLM CPU server's soak is in test_bench_long_vllm.py)."""

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

TOKENS, WINDOW = 2000, 400


def _soak(tmp: Path, *args: str, env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp / "soak.json"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "qwenquant",
            "bench",
            "soak",
            "--tokens",
            str(TOKENS),
            "--window",
            str(WINDOW),
            "--out",
            str(out),
            *args,
        ],
        env=env or {**os.environ, "QWENQUANT_NO_PROGRESS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    return r, out


def _errors(stderr: str) -> list[str]:
    return [x for x in stderr.splitlines() if x.startswith("error:")]  # the CLI's error line is never wrapped


@pytest.mark.parametrize("per_request", [False, True])
def test_healthy_soak_passes_with_windows_of_generated_tokens(tmp_path: Path, per_request: bool) -> None:
    with LongStandin() as s:
        s.per_request, s.step = per_request, 0.001
        r, out = _soak(tmp_path, s.url, *(["--concurrency", "2"] if per_request else []))
    assert r.returncode == 0, r.stderr
    rep = json.loads(out.read_text())
    assert rep["source"] == ("per-request" if per_request else "metrics") and rep["verdict"]["status"] == "ok"
    assert rep["token_count_approximate"] is False
    wins = rep["windows"]
    assert len(wins) == TOKENS // WINDOW and wins[-1]["end"] == pytest.approx(TOKENS, abs=3)
    for w in wins:  # 2 of 3 drafts accepted per step: positions 0 and 1 always, 2 never
        assert w["end"] - w["start"] == pytest.approx(WINDOW, abs=3)
        assert w["acceptance_rate"] == pytest.approx(2 / 3, abs=0.01) and w["per_position"][2] == 0.0
    assert [x["completion_tokens"] for x in rep["streams"]] == [TOKENS] * (2 if per_request else 1)
    if per_request:
        assert [len(ws) for ws in rep["stream_windows"]] == [5, 5] and wins[0][
            "drafts"
        ] == 2 * 133  # steps at tokens 1, 4, ..., 397
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG" and "verdict: ok" in flat(r.stderr)


@pytest.mark.parametrize("per_request", [False, True])
def test_collapse_after_n_tokens_names_the_window(tmp_path: Path, per_request: bool) -> None:
    with LongStandin() as s:
        s.per_request, s.step, s.collapse_after = per_request, 0.001, 1200
        r, out = _soak(tmp_path, s.url)
    assert r.returncode == 8, r.stderr
    errors = _errors(r.stderr)
    assert len(errors) == 1 and "MTP acceptance collapsed in window 3 (generated tokens 120" in errors[0], errors
    assert "no accepted drafts" in errors[0]
    rep = json.loads(out.read_text())
    assert rep["verdict"]["failures"][0]["kind"] == "collapse" and rep["windows"][3]["acceptance_rate"] == 0.0


def test_a_partial_collapse_below_the_fraction(tmp_path: Path) -> None:
    """Acceptance falls from 2/3 to 0 only in part of window 3: the window's rate is below half the first's."""
    with LongStandin() as s:
        s.step, s.collapse_after = 0.001, 1350
        r, _ = _soak(tmp_path, s.url, "--collapse-fraction", "0.9")
    assert r.returncode == 8 and "below 0.9 x the first window's 0.667" in _errors(r.stderr)[0]


def test_a_restart_mid_stream_names_its_window(tmp_path: Path) -> None:
    with LongStandin() as s:
        s.step, s.restart_after = 0.001, 900
        r, out = _soak(tmp_path, s.url)
    assert r.returncode == 8, r.stderr
    errors = _errors(r.stderr)
    assert len(errors) == 1 and "the server went away or restarted in window 2" in errors[0], errors
    assert "process start time moved" in errors[0]
    assert [f["kind"] for f in json.loads(out.read_text())["verdict"]["failures"]] == ["restart"]


def test_empty_and_error_streams(tmp_path: Path) -> None:
    with LongStandin() as s:  # every prompt is "deep": the empty fault streams nothing
        s.fail_depth, s.fail_mode = 1, "empty"
        r, _ = _soak(tmp_path, s.url)
    assert r.returncode == 8 and "stream 0 came back empty (window 0" in _errors(r.stderr)[0]
    with LongStandin() as s:
        s.fail_depth, s.fail_mode = 1, "http"
        r, _ = _soak(tmp_path, s.url)
    assert r.returncode == 8 and "stream 0 failed in window 0" in _errors(r.stderr)[0] and "answered 500" in r.stderr


def test_soak_longer_than_the_context_is_a_usage_error(tmp_path: Path) -> None:
    with LongStandin() as s:
        s.max_model_len = 2048
        r, _ = _soak(tmp_path, s.url)
    said = flat(r.stderr)
    assert r.returncode == 2 and "--tokens 2000 plus the prompt (" in said
    assert "by the server's /tokenize) does not fit the server's max_model_len 2048" in said


@pytest.fixture(scope="module")
def served(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("soakserve")
    return {
        "artifact": build_standin_artifact(tiny_checkpoint, root / "artifact"),
        "launcher": write_long_vllm(root / "fakevllm"),
    }


def test_served_concurrency_above_max_num_seqs_and_a_dying_server_past_the_trained_context(
    served: dict[str, Path], tmp_path: Path
) -> None:
    env = serve_env(served["launcher"], tmp_path)
    base = ["--serve", str(served["artifact"]), "--vllm", str(served["launcher"]), "--timeout", "60"]
    r, _ = _soak(tmp_path, *base, "--concurrency", "2", "--", "--max-model-len", "4096", env=env)
    assert r.returncode == 2 and "--concurrency 2 is above the profile's max_num_seqs 1" in flat(r.stderr)
    assert "starting" not in r.stderr and "server pid" not in r.stderr  # refused before vLLM starts, not after
    # above the tiny model's max_position_embeddings (4096): served because vLLM is told to allow it
    r, out = _soak(
        tmp_path,
        *base,
        "--",
        "--max-model-len",
        "8192",
        "--standin-fail-depth",
        "1",
        "--standin-fail-mode",
        "die",
        env={**env, "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"},
    )
    assert r.returncode == 8, r.stderr[-3000:]
    errors = _errors(r.stderr)
    assert len(errors) == 1 and "window 0" in errors[0] and "the server process exited with code 3" in errors[0], errors
