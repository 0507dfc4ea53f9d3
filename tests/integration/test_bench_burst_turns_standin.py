"""`qwenquant bench depth --concurrency N` (bursts) and `bench turns` (a conversation) against the
stand-in (tests/integration/standin_long.py). STAND-IN, not vLLM: no real vLLM fails a chosen number
of a burst's requests, fails at a chosen depth of a conversation, or reports prefix-cache hits on
demand (the real vLLM CPU server's burst and conversation are in test_bench_long_vllm.py)."""

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
    out = tmp / "r.json"
    r = subprocess.run(
        [sys.executable, "-m", "qwenquant", "bench", *args, "--out", str(out)],
        env=env or {**os.environ, "QWENQUANT_NO_PROGRESS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    return r, out


def _errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def test_burst_sends_fresh_prompts_of_each_depth_at_once(tmp_path: Path) -> None:
    with LongStandin() as s:
        s.max_model_len, s.ttft = 4096, 0.3
        r, out = _bench(tmp_path, "depth", s.url, "--concurrency", "3", "--depths", "1024,2048", "--max-tokens", "16")
        bodies = list(s.bodies)
    assert r.returncode == 0, r.stderr
    rep = json.loads(out.read_text())
    assert rep["concurrency"] == 3 and [x["concurrency"] for x in rep["rungs"]] == [3, 3]
    for rung in rep["rungs"]:
        assert rung["ok"] and rung["failed"] == 0 and len(rung["requests"]) == 3
        for q in rung["requests"]:
            assert rung["depth"] * 0.999 <= q["prompt_tokens"] <= rung["depth"] and q["completion_tokens"] == 16
        tt = rung["ttft"]
        assert 0.3 <= tt["min"] <= tt["median"] <= tt["max"] < 0.3 * 2, tt  # sent together: none waited on another
        assert rung["prefill_tok_s"] > rung["depth"] / tt["max"]  # the aggregate counts all three prompts
    firsts = [b["messages"][0]["content"].splitlines()[0] for b in bodies]
    assert len(set(firsts)) == 6 and all(rep["nonce"] in f for f in firsts)  # no shared prefix in or across bursts
    assert "burst ladder (3 fresh prompts at once per rung)" in r.stdout


def test_a_burst_wider_than_the_server_runs_is_flagged_as_a_queue(tmp_path: Path) -> None:
    """A server that runs one stream at a time and lists no max_num_seqs (as vLLM's /v1/models): the
    requests it holds back show on its queue gauges, and the rung is flagged "queued", never reported as a
    burst of 3 without a word; a server with room for all three gives no flag."""
    flags, said = {}, {}
    for limit in (1, 3):
        with LongStandin() as s:
            s.run_limit, s.step = limit, 0.02
            r, out = _bench(tmp_path, "depth", s.url, "--concurrency", "3", "--depths", "1024", "--max-tokens", "32")
        assert r.returncode == 0, r.stderr
        rep = json.loads(out.read_text())
        flags[limit] = [f for f in rep["flags"] if f.get("check") == "queued"]
        said[limit] = flat(r.stdout + r.stderr)
        assert rep["rungs"][0]["server_queue"]["max_running"] <= limit
    assert flags[3] == [] and "flag queued" not in said[3]
    assert len(flags[1]) == 1 and flags[1][0]["value"] >= 1, flags
    assert "flag queued: depth 1024: up to" in said[1] and "the rung measured a queue, not a burst of 3" in said[1]


def test_a_burst_fails_when_any_of_its_requests_fails(tmp_path: Path) -> None:
    with LongStandin() as s:
        s.max_model_len, s.fail_depth, s.fail_count = 4096, 1500, 1
        r, out = _bench(tmp_path, "depth", s.url, "--concurrency", "3", "--depths", "1024,2048,4000")
    assert r.returncode == 8, r.stderr
    errors = _errors(r.stderr)
    assert len(errors) == 1, r.stderr
    assert "the burst ladder (3 prompts at once) failed at 2048 tokens: 1 of 3 requests failed: " in errors[0], errors
    assert "500" in errors[0] and "EngineCore encountered an issue" in errors[0] and "worked: 102" in errors[0]
    rep = json.loads(out.read_text())
    assert [x["ok"] for x in rep["rungs"]] == [True, False] and rep["rungs"][1]["failed"] == 1
    assert "FAILED (1 of 3)" in r.stdout


@pytest.fixture(scope="module")
def served(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("burstserve")
    return {
        "artifact": build_standin_artifact(tiny_checkpoint, root / "artifact"),
        "launcher": write_long_vllm(root / "fakevllm"),
    }


def test_a_burst_above_max_num_seqs_is_refused(served: dict[str, Path], tmp_path: Path) -> None:
    env = serve_env(served["launcher"], tmp_path)
    r, _ = _bench(
        tmp_path,
        "depth",
        "--serve",
        str(served["artifact"]),
        "--vllm",
        str(served["launcher"]),
        "--timeout",
        "60",
        "--concurrency",
        "999",
        "--",
        "--max-model-len",
        "4096",
        env=env,
    )
    assert r.returncode == 2 and "--concurrency 999 is above the profile's max_num_seqs" in flat(r.stderr), r.stderr
    assert "starting" not in r.stderr and "server pid" not in r.stderr  # refused before vLLM starts, not after


def test_conversation_grows_until_the_context_is_full_and_reads_the_cache(tmp_path: Path) -> None:
    with LongStandin() as s:
        s.max_model_len = 3800
        r, out = _bench(tmp_path, "turns", s.url, "--turn-tokens", "1000", "--max-tokens", "32")
        bodies = list(s.bodies)
    assert r.returncode == 0, r.stderr
    rep = json.loads(out.read_text())
    turns = rep["turns"]
    assert len(turns) == 3 and [t["turn"] for t in turns] == [0, 1, 2] and rep["failure"] is None, turns
    depths = [t["depth"] for t in turns]
    assert depths[0] <= 1000 and all(b - a > 950 for a, b in zip(depths, depths[1:], strict=False)), depths
    assert depths[-1] + 32 <= 3800 < depths[-1] + 1032 + 32  # one more turn would not fit
    assert [len(b["messages"]) for b in bodies] == [1, 3, 5]
    assert bodies[2]["messages"][:4] == [*bodies[1]["messages"], {"role": "assistant", "content": "w " * 32}]
    assert all(t["new_tokens"] == d - p for t, d, p in zip(turns[1:], depths[1:], depths, strict=False))
    assert turns[0]["prefix_cache"]["hits"] == 0 and all(t["prefix_cache"]["hits"] > 0 for t in turns[1:])
    assert rep["prefix_cache"]["cached"] is True and "prefix cache: the server cached" in flat(r.stderr)
    assert "new-token prefill tok/s" in r.stdout


@pytest.mark.parametrize(
    ("cache", "says"),
    [("off", "prefix cache: NO hits after turn 0"), ("absent", "prefix cache: unknown (no vllm:prefix_cache_*")],
)
def test_conversation_says_when_the_server_did_not_cache(tmp_path: Path, cache: str, says: str) -> None:
    with LongStandin() as s:
        s.max_model_len, s.prefix_cache = 3000, cache
        r, out = _bench(tmp_path, "turns", s.url, "--turn-tokens", "1000", "--max-tokens", "8")
    assert r.returncode == 0, r.stderr
    assert says in flat(r.stderr) and json.loads(out.read_text())["prefix_cache"]["cached"] is not True


@pytest.mark.parametrize(("mode", "says"), [("http", "answered 500"), ("empty", "empty output")])
def test_a_failing_turn_ends_the_conversation(tmp_path: Path, mode: str, says: str) -> None:
    with LongStandin() as s:
        s.max_model_len, s.fail_depth, s.fail_mode = 8192, 2500, mode
        r, out = _bench(tmp_path, "turns", s.url, "--turn-tokens", "1000", "--max-tokens", "16")
    assert r.returncode == 8, r.stderr
    errors = _errors(r.stderr)
    assert len(errors) == 1 and "the conversation failed at turn 2 (" in errors[0] and says in errors[0], r.stderr
    rep = json.loads(out.read_text())
    assert [t["ok"] for t in rep["turns"]] == [True, True, False] and rep["failure"]["turn"] == 2
    assert f"deepest context that worked: {rep['turns'][1]['depth']}" in errors[0]


def test_turns_has_no_concurrency(tmp_path: Path) -> None:
    """The conversation is one user's: `bench turns` takes no --concurrency (a burst is `bench depth --concurrency`)."""
    r, _ = _bench(tmp_path, "turns", "http://127.0.0.1:9", "--concurrency", "2")
    assert r.returncode == 2 and "No such option: --concurrency" in flat(r.stderr)
