"""Every `qwenquant bench` figure checked against an independent count, in every mode, each check seen to
fire against a fault of the stand-in servers (tests/integration/standin.py, standin_long.py).

STAND-IN, not vLLM: a real vLLM cannot be told to hide a reasoning phase it counts, to count tokens it
did not send, to cut a stream before `[DONE]`, or to ping without producing a token.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from standin import StandinServer
from standin_long import LongStandin

from helpers import flat

REPO = Path(__file__).resolve().parents[2]
MODES = {
    "run": ["--prompts", "narrative", "--sampling", "greedy", "--max-tokens", "40"],
    "depth": ["--depths", "1024", "--max-tokens", "64"],
    "soak": ["--tokens", "400", "--window", "100"],
    "turns": ["--turn-tokens", "1000", "--max-tokens", "64"],
}


def bench(mode: str, url: str, tmp: Path, *extra: str) -> tuple[subprocess.CompletedProcess, dict | None]:
    """`qwenquant bench` in one mode against `url`: (the process, the JSON report or None)."""
    cfg = yaml.safe_load((REPO / "src/qwenquant/bench/data/bench.yaml").read_text())
    cfg.update(warmup_requests=0, repeats=1)
    (tmp / "bench.yaml").write_text(yaml.safe_dump(cfg))
    out = tmp / f"{mode}.json"
    argv = [sys.executable, "-m", "qwenquant", "bench", mode, url, *MODES[mode], "--out", str(out), *extra]
    if mode == "run":
        argv += ["--config", str(tmp / "bench.yaml")]
    r = subprocess.run(
        argv, env={**os.environ, "QWENQUANT_NO_PROGRESS": "1"}, capture_output=True, text=True, timeout=300
    )
    return r, json.loads(out.read_text()) if out.exists() else None


def _errors(stderr: str) -> list[str]:
    return [x for x in stderr.splitlines() if x.startswith("error:")]  # the CLI's error line is never wrapped


def _checks(report: dict) -> list[str]:
    return [f["check"] for f in report["flags"] if f.get("kind") == "cross-check"]


@pytest.mark.parametrize("thinking", ["on", "off"])
@pytest.mark.parametrize("details", [False, True])
def test_plain_bench_flags_reasoning_counted_but_not_streamed(tmp_path: Path, thinking: str, details: bool) -> None:
    """20 of 40 tokens generated with no text: decode over the streamed phase is 2x; flagged whatever the
    thinking setting, exactly when usage says how many reasoning tokens it counted."""
    with StandinServer() as s:
        s.hidden, s.reasoning_details = 20, details
        r, rep = bench("run", s.url, tmp_path, "--thinking", thinking)
    assert r.returncode == 0, r.stderr
    assert _checks(rep) == (["unstreamed-reasoning"] if details else ["wall-vs-decode"])
    says = (
        "20 of 40 reasoning tokens were counted in usage but not streamed"
        if details
        else "counted in usage but not streamed"
    )
    assert says in flat(r.stderr)


@pytest.mark.parametrize("mode", ["depth", "soak", "turns"])
def test_long_modes_flag_reasoning_counted_but_not_streamed(tmp_path: Path, mode: str) -> None:
    """The long modes run the same check per rung, stream and turn (they had none)."""
    with LongStandin() as s:
        s.hidden, s.reasoning_details, s.max_model_len = 30, True, 8192
        r, rep = bench(mode, s.url, tmp_path)
    assert rep is not None, r.stderr
    assert "unstreamed-reasoning" in _checks(rep), rep["flags"]
    assert "30 of" in flat(r.stderr) and "reasoning tokens were counted in usage but not streamed" in flat(r.stderr)


def test_depth_without_token_ids_compares_wall_and_decode(tmp_path: Path) -> None:
    with LongStandin() as s:
        s.hidden, s.step = 40, 0.01
        r, rep = bench("depth", s.url, tmp_path)
    assert r.returncode == 0, r.stderr
    assert _checks(rep) == ["wall-vs-decode"] and "no token ids came back to tell" in flat(r.stderr)


@pytest.mark.parametrize(
    ("short_by", "delta", "status", "says"),
    [
        (
            100,
            100,
            "failed",
            "stream 0 was truncated in window 3: 300 of 400 tokens streamed",
        ),  # usage over-reports a cut
        (0, -100, "ok", None),  # usage under-reports a complete stream
    ],
)
def test_soak_judges_truncation_from_the_streamed_count(
    tmp_path: Path, short_by: int, delta: int, status: str, says: str | None
) -> None:
    with LongStandin() as s:
        s.short_by, s.usage_delta = short_by, delta
        r, rep = bench("soak", s.url, tmp_path)
    assert rep["verdict"]["status"] == status, rep["verdict"]
    assert r.returncode == (8 if status == "failed" else 0), r.stderr
    if says:
        assert says in _errors(r.stderr)[0]
    assert "usage-mismatch" in _checks(rep)
    assert "usage counts" in flat(r.stderr) and "the stream carried" in flat(r.stderr)


def test_a_cut_stream_is_a_closed_connection_not_missing_usage(tmp_path: Path) -> None:
    with StandinServer() as s:
        s.cut_after = 5
        r, _ = bench("run", s.url, tmp_path)
    assert r.returncode == 8
    errors = _errors(r.stderr)
    assert len(errors) == 1 and "connection closed after 6 events without `data: [DONE]`" in errors[0], r.stderr
    assert "include_usage" not in r.stderr


def test_depth_names_a_cut_stream(tmp_path: Path) -> None:
    with LongStandin() as s:
        s.fail_depth, s.fail_mode = 1000, "cut"
        r, _ = bench("depth", s.url, tmp_path)
    assert r.returncode == 8 and "connection closed after 2 events" in _errors(r.stderr)[0], r.stderr


def test_plain_bench_applies_the_stall_limit_and_pings_are_not_progress(tmp_path: Path) -> None:
    """A server that sends three tokens, then only keep-alive comments: the request fails at the limit."""
    with StandinServer() as s:
        s.hang_after = 3
        t0 = time.monotonic()
        r, _ = bench("run", s.url, tmp_path, "--stall-timeout", "1")
        took = time.monotonic() - t0
    assert r.returncode == 8 and "stalled: no token from the server for 1 s" in _errors(r.stderr)[0], r.stderr
    assert took < 20


@pytest.mark.parametrize("mode", ["depth", "turns"])
def test_keep_alive_comments_do_not_pass_the_stall_limit(tmp_path: Path, mode: str) -> None:
    with LongStandin() as s:
        s.fail_depth, s.fail_mode = 900, "ping"
        t0 = time.monotonic()
        r, _ = bench(mode, s.url, tmp_path, "--stall-timeout", "1")
        took = time.monotonic() - t0
    assert r.returncode == 8 and "stalled: no token from the server for 1 s" in _errors(r.stderr)[0], r.stderr
    assert took < 20


def test_soak_window_found_by_an_approximate_count_says_so(tmp_path: Path) -> None:
    """No token ids: one token per chunk is a floor (a step's chunk carries 3), so the window is approximate."""
    with LongStandin() as s:
        s.token_ids, s.collapse_after = False, 200
        r, rep = bench("soak", s.url, tmp_path)
    assert r.returncode == 8 and rep["token_count_approximate"] is True
    line = _errors(r.stderr)[0]
    assert "MTP acceptance collapsed in window" in line and "an approximate count" in line, line


def test_depth_names_both_rungs_by_one_count_when_usage_and_tokenize_disagree(tmp_path: Path) -> None:
    """The server's usage counts every prompt at twice /tokenize's count: the ladder fails at the 4096 rung,
    and the last rung that worked is the 2048 one, not '4094'."""
    with LongStandin() as s:
        s.max_model_len, s.usage_prompt_scale, s.fail_depth = 8192, 2.0, 4000
        r, rep = bench("depth", s.url, tmp_path, "--depths", "1024,2048,4096")
    assert r.returncode == 8, r.stderr
    line = _errors(r.stderr)[0]
    assert "failed at 4096 tokens" in line and "last depth that worked: 2048 by /tokenize" in line, line
    assert "the two counts disagree" in line and "prompt-count" in _checks(rep)


def test_depth_without_tokenize_says_the_failing_rung_is_approximate(tmp_path: Path) -> None:
    with LongStandin() as s:
        s.tokenize, s.fail_depth = False, 1500
        r, _ = bench("depth", s.url, tmp_path, "--depths", "1000,2000")
    assert r.returncode == 8, r.stderr
    line = _errors(r.stderr)[0]
    assert "failed at about 2000 tokens (an approximate count: the server has no /tokenize)" in line, line


def test_soak_without_drafts_is_not_judged(tmp_path: Path) -> None:
    with LongStandin() as s:
        s.mtp = False
        r, rep = bench("soak", s.url, tmp_path)
    assert r.returncode == 0, r.stderr
    assert rep["verdict"]["status"] == "not judged" and rep["verdict"]["acceptance_judged"] is False
    assert "verdict: not judged: acceptance not judged: the server drafted no tokens" in flat(r.stderr)
    assert "verdict: ok" not in flat(r.stderr)
