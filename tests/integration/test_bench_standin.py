"""`qwenquant bench URL` against the loopback stand-in OpenAI server (tests/integration/standin.py):
the figures a user reads in the JSON agree with the server's own clock, whichever field carries
the text, with a hidden reasoning phase, and a stream without usage is refused, not guessed.

Tolerance: TTFT within 15 ms of the server's first-text time, rates within 5% of the rates the
server's own send times give (loopback adds well under a millisecond per event).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from standin import StandinServer

REPO = Path(__file__).resolve().parents[2]
WARMUP = 1
REPEATS = 3
TTFT_TOL_S = 0.015
RATE_TOL = 0.05


def _bench(url: str, tmp: Path, *extra: str) -> tuple[subprocess.CompletedProcess, Path]:
    cfg = yaml.safe_load((REPO / "src/qwenquant/bench/data/bench.yaml").read_text())
    cfg.update(warmup_requests=WARMUP, repeats=REPEATS)
    cpath = tmp / "bench.yaml"
    cpath.write_text(yaml.safe_dump(cfg))
    out = tmp / "result.json"
    env = {**os.environ, "QWENQUANT_NO_PROGRESS": "1"}
    head, rest = (["run", url], extra) if url else ([extra[0]], extra[1:])  # no URL: the subcommand comes first
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "qwenquant",
            "bench",
            *head,
            "--config",
            str(cpath),
            "--prompts",
            "narrative",
            "--sampling",
            "greedy",
            "--thinking",
            "off",
            "--out",
            str(out),
            *rest,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return r, out


def _check_against_server(report: dict, s: StandinServer, skip: int) -> dict:
    cell = report["targets"][0]["cells"]["narrative/greedy/think-off/c1"]
    recs = s.records[skip : skip + REPEATS]
    assert len(cell["per_request"]) == REPEATS == len(recs)
    for got, rec in zip(cell["per_request"], recs, strict=True):
        assert got["completion_tokens"] == rec.tokens == 40
        assert got["text_events"] == 40 - s.hidden
        assert abs(got["ttft_s"] - (rec.first - rec.recv)) < TTFT_TOL_S, (got, rec)
        assert got["wall_tok_s"] == pytest.approx(rec.tokens / (rec.done - rec.recv), rel=RATE_TOL)
        assert got["decode_tok_s"] == pytest.approx((rec.tokens - 1) / (rec.done - rec.first), rel=RATE_TOL)
        assert got["prefill_tok_s"] == pytest.approx(120 / got["ttft_s"])
    return cell


@pytest.mark.parametrize("field", ["content", "reasoning_content", "reasoning"])
def test_rates_and_ttft_whichever_field_carries_the_text(field: str, tmp_path: Path) -> None:
    with StandinServer() as s:
        s.field = field
        s.spec = (10.0, 30.0, 20.0, (9.0, 7.0, 4.0))  # drafts, draft tokens, accepted, per position
        s.noisy = WARMUP
        r, out = _bench(s.url, tmp_path, "--max-tokens", "40")
    assert r.returncode == 0, r.stderr
    report = json.loads(out.read_text())
    cell = _check_against_server(report, s, WARMUP)
    assert cell["first_text_field"] == {field: REPEATS}
    assert cell["figures"]["ttft_s"]["median"] == pytest.approx(0.05, abs=0.03)  # what the server was told
    assert cell["figures"]["decode_tok_s"]["median"] == pytest.approx(50, rel=0.1)
    # acceptance from /metrics deltas: warm-up's noisy counters and the starting values left out
    acc = report["targets"][0]["acceptance"]
    assert acc["mean_acceptance_length"] == pytest.approx(3.0)
    assert acc["per_position"] == pytest.approx([0.9, 0.7, 0.4])
    assert acc["acceptance_rate"] == pytest.approx(20 / 30)
    assert not [f for f in report["flags"] if f["kind"] == "cross-check"], report["flags"]
    assert "wall tok/s" in r.stdout and "decode tok/s" in r.stdout
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_hidden_reasoning_phase_starts_the_clock_at_the_first_text(tmp_path: Path) -> None:
    """20 of 40 tokens think without streaming text: TTFT runs to the first text, usage counts all 40, and
    the wall and decode rates disagree, which is flagged (a cross-check, in every thinking setting)."""
    with StandinServer() as s:
        s.hidden = 20
        r, out = _bench(s.url, tmp_path, "--max-tokens", "40")
    assert r.returncode == 0, r.stderr
    report = json.loads(out.read_text())
    cell = _check_against_server(report, s, WARMUP)
    assert cell["figures"]["ttft_s"]["median"] == pytest.approx(0.05 + 20 * 0.02, abs=0.03)
    flags = [f for f in report["flags"] if f["kind"] == "cross-check"]
    assert [(f["check"], f["where"]) for f in flags] == [("wall-vs-decode", "A narrative/greedy/think-off/c1")]


def test_missing_usage_is_an_error_not_a_guess(tmp_path: Path) -> None:
    with StandinServer() as s:
        s.usage = False
        r, out = _bench(s.url, tmp_path, "--max-tokens", "8")
    assert r.returncode == 8
    assert "no token usage" in r.stderr and "does not guess" in r.stderr
    assert "hint:" in r.stderr
    assert not out.exists()


def _streams_at_once(recs: list) -> list[int]:
    """How many streams each busy spell of the server held open together, on its own clock."""
    spells: list[list[float]] = []  # [end of the spell, streams in it]
    for r in sorted(recs, key=lambda r: r.recv):
        if spells and r.recv < spells[-1][0]:
            spells[-1] = [max(spells[-1][0], r.done), spells[-1][1] + 1]
        else:
            spells.append([r.done, 1])
    return sorted(int(n) for _, n in spells)


def test_ladder_aggregate_and_too_good_line(tmp_path: Path) -> None:
    """The c2 rung sends its streams two at a time (the server sees one spell of two streams per wave, warm-up
    included; the c1 rung one stream per spell) and sums each wave's two streams; a too-good line below the figures flags them for audit. Counts, not wall
    time: a rate ratio on a shared machine is a timing assert."""
    cfg = yaml.safe_load((REPO / "src/qwenquant/bench/data/bench.yaml").read_text())
    with StandinServer() as s:
        r, out = _bench(s.url, tmp_path, "--max-tokens", "40", "--max-concurrency", "2")
        assert r.returncode == 0, r.stderr
        report = json.loads(out.read_text())
        ladder = report["targets"][0]["ladder"]
        assert [x["concurrency"] for x in ladder] == [1, 2]
        one, two = ladder
        assert two["per_stream_wall_tok_s"]["n"] == 2 * two["aggregate_tok_s"]["n"] > 0
        assert one["per_stream_wall_tok_s"]["n"] == one["aggregate_tok_s"]["n"] > 0
        assert _streams_at_once(s.records) == [1] * (WARMUP + REPEATS) + [2] * (WARMUP + REPEATS)
        cfg["too_good"]["decode_tok_s"] = 10.0
        low = tmp_path / "low"
        low.mkdir()
        (low / "cfg.yaml").write_text(yaml.safe_dump({**cfg, "warmup_requests": 0, "repeats": 1}))
        out2 = low / "r.json"
        r2 = subprocess.run(
            [
                sys.executable,
                "-m",
                "qwenquant",
                "bench",
                "run",
                s.url,
                "--config",
                str(low / "cfg.yaml"),
                "--prompts",
                "code",
                "--sampling",
                "greedy",
                "--thinking",
                "off",
                "--max-tokens",
                "10",
                "--out",
                str(out2),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert r2.returncode == 0, r2.stderr
    flags = json.loads(out2.read_text())["flags"]
    # the cell's decode, and the ladder's per-stream decode beside it: every table judges by the same line
    assert [(f["where"], f["figure"]) for f in flags if f["kind"] == "too-good"] == [
        ("A code/greedy/think-off/c1", "decode_tok_s"),
        ("A ladder c1", "per_stream_decode_tok_s"),
    ]
    assert "AUDIT" in r2.stdout


def test_compare_two_servers_in_rounds(tmp_path: Path) -> None:
    """A streams twice as fast as B: every round's decode ratio A/B is about 2, requests alternate A B A B."""
    with StandinServer() as a, StandinServer() as b:
        a.step, b.step = 0.01, 0.02
        r, out = _bench(
            "",
            tmp_path,
            "compare",
            "--max-tokens",
            "30",
            "--rounds",
            "2",
            "--label-a",
            "fast",
            "--url-a",
            a.url,
            "--label-b",
            "slow",
            "--url-b",
            b.url,
        )
        order = sorted([(rec.recv, "a") for rec in a.records] + [(rec.recv, "b") for rec in b.records])
    assert r.returncode == 0, r.stderr
    report = json.loads(out.read_text())
    ratio = report["compare"]["cells"]["narrative/greedy/think-off/c1"]
    assert (report["compare"]["a"], report["compare"]["b"], ratio["decode_tok_s"]["n"]) == ("fast", "slow", 2)
    assert ratio["decode_tok_s"]["min"] == pytest.approx(2.0, rel=0.1)
    assert ratio["decode_tok_s"]["max"] == pytest.approx(2.0, rel=0.1)
    measured = "".join(who for _, who in order)[2 * WARMUP :]
    assert measured == "aaabbbaaabbb"  # rounds interleaved, REPEATS requests per turn
    assert "ratio fast / slow" in r.stdout


def test_gpu_sampling_flags_throttling(tmp_path: Path) -> None:
    """A stand-in `nvidia-smi` on PATH (no GPU here) reports a power-capped clock: the run is flagged."""
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text(
        "#!/bin/sh\n"
        'row() { echo "2026/11/30 10:00:00.000, 0, NVIDIA H200, $1, 1980, 650.0, 700.00, 60, $2"; }\n'
        'case "$*" in *-lms*) row 1980 0x0000000000000000; row 1410 0x0000000000000004; '
        "exec sleep 600;; *name*) echo 'NVIDIA H200';; *) row 1980 0x0;; esac\n"
    )
    fake.chmod(0o755)
    with StandinServer() as s:
        os.environ["PATH"] = f"{fake.parent}:{os.environ['PATH']}"
        try:
            r, out = _bench(s.url, tmp_path, "--max-tokens", "40")
        finally:
            os.environ["PATH"] = os.environ["PATH"].split(":", 1)[1]
    assert r.returncode == 0, r.stderr
    report = json.loads(out.read_text())
    assert report["gpu_name"] == "NVIDIA H200"
    assert report["gpu"]["throttle_reasons"] == {"sw_power_cap": 1} and report["gpu"]["sm_mhz"]["min"] == 1410
    assert [f["kind"] for f in report["flags"]] == ["throttle"]
    assert "throttled in 50% of 2 samples" in r.stderr
