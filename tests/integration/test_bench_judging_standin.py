"""Every bench mode judges what it measured the same way (bench/judge.py), against the stand-in servers.

STAND-IN, not vLLM: tests/integration/standin.py and standin_long.py are test doubles. A real vLLM cannot be
told to decode faster than physics allows, to end a stream short with `ignore_eos` sent, to run one request
at a time while listing no max_num_seqs, to lose one chosen request, or to want an API key of a test's
choosing on demand; the figures and verdicts a user reads are the same whichever server sent the stream.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from standin import StandinServer
from standin_long import LongStandin

from helpers import flat

REPO = Path(__file__).resolve().parents[2]


def _qq(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "qwenquant", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "QWENQUANT_NO_PROGRESS": "1"},
        cwd=REPO,
    )


def _config(tmp: Path, **over: Any) -> Path:
    cfg = yaml.safe_load((REPO / "src/qwenquant/bench/data/bench.yaml").read_text())
    cfg.update(warmup_requests=1, repeats=2, rounds=1, **over)
    path = tmp / "bench.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _run_args(tmp: Path, **over: Any) -> list[str]:
    return [
        "--config",
        str(_config(tmp, **over)),
        "--prompts",
        "narrative",
        "--sampling",
        "greedy",
        "--thinking",
        "off",
        "--out",
        str(tmp / "run.json"),
    ]


def _flags(report: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [f for f in report["flags"] if f["kind"] == kind or f.get("check") == kind]


def _errors(stderr: str) -> list[str]:
    return [x for x in stderr.splitlines() if x.startswith("error:")]


def _section(stdout: str, title: str, end: str | None) -> str:
    """The table under `title` on stdout, up to the next table's title."""
    start = stdout.index(title)
    return stdout[start : stdout.index(end, start) if end else None]


def test_soak_flags_too_good_figures_and_streams_the_server_queued(tmp_path: Path) -> None:
    """Two soak streams on a server that runs one at a time (and lists no max_num_seqs): the "queued" flag depth
    gives; their decode (3 tokens every 2 ms) beyond the too-good line: AUDIT, as in every mode."""
    with LongStandin() as s:
        s.step, s.run_limit = 0.002, 1  # 1,500 tok/s; streams of 0.4 s, seen waiting on /metrics (read every 0.1 s)
        r = _qq(
            "bench",
            "soak",
            s.url,
            "--tokens",
            "600",
            "--window",
            "200",
            "--concurrency",
            "2",
            "--out",
            str(tmp_path / "soak.json"),
        )
    assert r.returncode == 0, r.stderr
    rep = json.loads((tmp_path / "soak.json").read_text())
    queued = _flags(rep, "queued")
    assert len(queued) == 1 and queued[0]["where"] == "soak", rep["flags"]
    assert "the soak measured a queue, not 2 streams at once" in flat(r.stderr)
    good = {(f["where"], f["figure"]) for f in _flags(rep, "too-good")}
    assert {("stream 0", "decode_tok_s"), ("stream 1", "decode_tok_s")} <= good
    assert "decode AUDIT tok/s" in flat(r.stderr) and "flag too-good: stream 0 decode_tok_s" in flat(r.stderr)


def test_turns_flag_too_good_figures_and_short_answers(tmp_path: Path) -> None:
    """Answers that end 8 tokens before the 64 asked (ignore_eos sent) are flagged per turn, and a decode beyond
    the too-good line reads AUDIT in the conversation's table."""
    with LongStandin() as s:
        s.step, s.short_by, s.max_model_len = 0.001, 8, 2048
        r = _qq("bench", "turns", s.url, "--turn-tokens", "600", "--out", str(tmp_path / "turns.json"))
    assert r.returncode == 0, r.stderr
    rep = json.loads((tmp_path / "turns.json").read_text())
    short = _flags(rep, "short-stream")
    assert [f["where"] for f in short] == [f"turn {t['turn']}" for t in rep["turns"]]
    assert "ended after 56 of the 64 tokens asked" in short[0]["note"]
    assert ("turn 0", "decode_tok_s") in {(f["where"], f["figure"]) for f in _flags(rep, "too-good")}
    assert "AUDIT" in r.stdout


def test_depth_flags_a_rung_whose_stream_ended_short(tmp_path: Path) -> None:
    with LongStandin() as s:
        s.short_by = 3
        r = _qq("bench", "depth", s.url, "--depths", "512,1024", "--out", str(tmp_path / "depth.json"))
    assert r.returncode == 0, r.stderr
    rep = json.loads((tmp_path / "depth.json").read_text())
    assert [f["where"] for f in _flags(rep, "short-stream")] == ["depth 512", "depth 1024"]
    assert "flag short-stream: depth 512: the stream ended after 61 of the 64 tokens asked" in flat(r.stderr)


def test_depth_top_rung_is_exactly_at_the_limit(tmp_path: Path) -> None:
    """README: the default ladder's last rung is exactly max_model_len minus the output and the draft tokens of a
    drafting server (the stand-in lists 3), not a prompt fitted within 0.1% below it (37 template tokens put the
    text's steps where the plain fit stops one short)."""
    with LongStandin() as s:
        s.max_model_len, s.template_tokens = 2048, 37
        r = _qq("bench", "depth", s.url, "--out", str(tmp_path / "depth.json"))
    assert r.returncode == 0, r.stderr
    rep = json.loads((tmp_path / "depth.json").read_text())
    assert rep["depths"] == [1024, 1981] and rep["draft_tokens"] == 3
    assert rep["rungs"][-1]["prompt_tokens"] == 1981 and rep["last_ok_depth"] == 1981
    assert "deepest prompt that worked: 1981 tokens" in flat(r.stderr)


def test_soak_limit_comes_from_the_prompts_real_count(tmp_path: Path) -> None:
    """--tokens plus the prompt as /tokenize counts it (not an estimate from its characters) must fit."""
    with LongStandin() as s:
        s.max_model_len, s.step = 2048, 0.0005
        ok = _qq("bench", "soak", s.url, "--tokens", "1600", "--window", "800", "--out", str(tmp_path / "a.json"))
        prompt = s.prompt_tokens(s.bodies[-1])
        refused = _qq("bench", "soak", s.url, "--tokens", str(2048 - prompt + 1), "--out", str(tmp_path / "b.json"))
    assert ok.returncode == 0, ok.stderr
    assert refused.returncode == 2, refused.stderr
    assert f"plus the prompt ({prompt} tokens by the server's /tokenize)" in _errors(refused.stderr)[0]
    assert f"use --tokens {2048 - prompt} or less" in flat(refused.stderr)


def test_compare_of_one_server_with_itself_warns(tmp_path: Path) -> None:
    with StandinServer() as s:
        r = _qq("bench", "compare", "--url-a", s.url, "--url-b", s.url + "/v1", *_run_args(tmp_path))
    assert r.returncode == 0, r.stderr
    assert f"--url-a and --url-b are one server ({s.url})" in flat(r.stderr)


def test_compare_shows_audit_in_every_table(tmp_path: Path) -> None:
    """A decode beyond the too-good line reads AUDIT in the one-stream table, in the concurrency ladder's
    per-stream column and in the ratio table (never the raw figure)."""
    with StandinServer() as s1, StandinServer() as s2:
        s1.step = s2.step = 0.0002
        r = _qq("bench", "compare", "--url-a", s1.url, "--url-b", s2.url, *_run_args(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "one server" not in r.stderr
    rep = json.loads((tmp_path / "run.json").read_text())
    raw = rep["targets"][0]["ladder"][0]["per_stream_decode_tok_s"]["median"]
    assert raw > 1000 and f"{raw:.1f}" not in r.stdout
    ladder = _section(r.stdout, "concurrency ladder", "speculative decoding")
    rows = [row for row in ladder.splitlines() if row.startswith(("│ A ", "│ B "))]
    assert len(rows) == 2 and all(row.rstrip(" │").endswith("AUDIT") for row in rows), ladder  # per-stream decode
    ratio = _section(r.stdout, "ratio A / B", "flags")
    row = next(x for x in ratio.splitlines() if "narrative/greedy" in x)
    assert row.count("AUDIT") >= 1


def test_a_run_that_loses_one_request_keeps_what_it_measured(tmp_path: Path) -> None:
    """The warm-up's request and the first measured one worked, the second was cut: exit 8 naming it, and the
    report (on stdout too, with --json) keeps the measured request with the failure."""
    with StandinServer() as s:
        s.cut_request = 2
        r = _qq("bench", "run", s.url, *_run_args(tmp_path), "--json")
    assert r.returncode == 8, r.stderr
    assert json.loads(r.stdout)["failure"]["round"] == 1  # --json: the report itself, one document
    errors = _errors(r.stderr)
    assert len(errors) == 1 and "1 of 1 requests of A narrative/greedy/think-off/c1 (round 1) failed" in errors[0]
    assert "keeps the 1 requests measured before it" in errors[0]
    rep = json.loads((tmp_path / "run.json").read_text())
    assert rep["failure"]["cell"] == "narrative/greedy/think-off/c1"
    assert rep["targets"][0]["cells"]["narrative/greedy/think-off/c1"]["requests"] == 1


def test_a_server_that_wants_an_api_key_gets_the_api_key_hint(tmp_path: Path) -> None:
    with StandinServer() as s:
        s.api_key = "k"
        r = _qq("bench", "run", s.url, *_run_args(tmp_path))
    assert r.returncode == 8 and "answered 401" in _errors(r.stderr)[0], r.stderr
    assert "pass --api-key KEY" in flat(r.stderr)


def test_depth_json_prints_one_document_when_the_server_is_down(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: refused
        r = _qq("bench", "depth", f"http://127.0.0.1:{port}", "--json", "--out", str(tmp_path / "d.json"))
    assert r.returncode == 8, r.stderr
    doc = json.loads(r.stdout)
    assert doc["mode"] == "depth" and doc["ok"] is False and doc["exit_code"] == 8
    assert f"127.0.0.1:{port}" in doc["error"] and doc["hint"]


def test_run_flags_a_ladder_step_the_server_queued(tmp_path: Path) -> None:
    """`bench run --max-concurrency 2` on a server that runs one stream at a time (and lists no max_num_seqs):
    the ladder's two-stream step measured a queue, flagged as depth's burst and the soak flag it."""
    with LongStandin() as s:
        s.run_limit, s.step = 1, 0.02  # streams of 0.3 s: the queue is seen on /metrics (read every 0.1 s)
        r = _qq("bench", "run", s.url, *_run_args(tmp_path), "--max-tokens", "40", "--max-concurrency", "2")
    assert r.returncode == 0, r.stderr
    rep = json.loads((tmp_path / "run.json").read_text())
    assert [f["where"] for f in _flags(rep, "queued")] == ["A ladder c2"]
    assert "flag queued: A ladder c2: up to 1 of the 2 requests waited" in flat(r.stderr)
