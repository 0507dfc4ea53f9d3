"""`qwenquant eval served` against a stand-in server, and the same MTP figures from `qwenquant bench`.

STAND-IN: the server is tests/integration/standin.py in the test process, not vLLM. It answers
/v1/models, /v1/completions (from a fixed prompt -> text table), streamed chat completions and a
Prometheus /metrics page whose speculative-decoding counters start at non-zero values and grow by
set amounts per request, so the expected acceptance figures are known exactly. A real vLLM cannot
be made to accept a chosen number of drafts; the real-vLLM run of the gate is in test_eval_vllm.py.
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
ANSWERS = {"import o": "s\nimport sys", "def f(sel": "f, x):", "while Tr": "ue:\n"}
GATE = {
    "name": "standin",
    "tasks": [
        {"name": "imports", "cases": [{"prompt": "import o", "expect": "s\nimport"}]},
        {"name": "defs", "cases": [{"prompt": "def f(sel", "expect": "f,"}, {"prompt": "while Tr", "expect": "ue:"}]},
    ],
    "acceptance_runs": [{"prompt": "import o", "max_tokens": 8}],
}


@pytest.fixture
def server():
    """Start stand-ins answering `answers`; `with_drafts` False: counters present but never growing."""
    servers = []

    def start(answers: dict[str, str] = ANSWERS, with_drafts: bool = True, total_suffix: bool = True) -> StandinServer:
        s = StandinServer().__enter__()
        s.answers, s.total_suffix = answers, total_suffix
        if not with_drafts:
            s.spec = (0.0, 0.0, 0.0, (0.0, 0.0, 0.0))
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.__exit__(None, None, None)


def _eval(url: str, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    gate = tmp_path / "gate.json"
    gate.write_text(json.dumps(GATE))
    return subprocess.run(
        [sys.executable, "-m", "qwenquant", "eval", "served", url, "--gate", str(gate), "--json", *extra],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env=dict(os.environ),
    )


def test_gate_passes_and_acceptance_comes_from_counter_deltas(server, tmp_path: Path) -> None:
    s = server()
    proc = _eval(s.url, tmp_path, "--min-acceptance-length", "2.4", "--report", str(tmp_path / "r.json"))
    assert proc.returncode == 0, proc.stderr
    assert [(b["model"], b["temperature"]) for b in s.bodies] == [("standin", 0.0)] * 4  # greedy, the listed model
    out = json.loads(proc.stdout)
    assert [(t["name"], t["passed"], t["total"]) for t in out["tasks"]] == [("imports", 1, 1), ("defs", 2, 2)]
    m = out["mtp"]
    # 3 gate completions + 1 acceptance run: 16 drafts, 48 draft tokens, 24 accepted -> 1 + 24/16 = 2.5
    # (not the absolute counters' 1 + 74/116)
    assert (m["drafts"], m["draft_tokens"], m["accepted_tokens"]) == (16, 48, 24)
    assert m["mean_acceptance_length"] == pytest.approx(2.5)
    assert m["per_position"] == pytest.approx({"0": 0.75, "1": 0.5, "2": 0.25})
    assert "mean acceptance length 2.500" in proc.stderr and "task defs: 2/2 passed" in proc.stderr
    assert json.loads((tmp_path / "r.json").read_text())["ok"] is True


def test_low_acceptance_fails_the_command(server, tmp_path: Path) -> None:
    proc = _eval(server().url, tmp_path, "--min-acceptance-length", "2.6")
    assert proc.returncode != 0
    assert "MTP mean acceptance length 2.500 is below 2.6" in proc.stderr
    assert json.loads(proc.stdout)["ok"] is False


def test_a_wrong_answer_fails_its_task(server, tmp_path: Path) -> None:
    proc = _eval(server({**ANSWERS, "while Tr": "y:\n"}).url, tmp_path)
    assert proc.returncode != 0
    assert "task defs: 1/2 passed, needs 2" in proc.stderr
    fail = json.loads(proc.stdout)["tasks"][1]["failures"]
    assert fail == [{"prompt": "while Tr", "expect": "ue:", "got": "y:\n"}]


def test_no_drafts_fails_when_acceptance_is_required(server, tmp_path: Path) -> None:
    url = server(with_drafts=False).url
    assert _eval(url, tmp_path).returncode == 0  # no threshold asked: the gate alone decides
    proc = _eval(url, tmp_path, "--min-acceptance-length", "1.1")
    assert proc.returncode != 0
    assert "reported no speculative drafts" in proc.stderr


def _bench_acceptance(url: str, tmp_path: Path) -> dict:
    cfg = yaml.safe_load((REPO / "src/qwenquant/bench/data/bench.yaml").read_text())
    cfg.update(warmup_requests=1, repeats=2)
    (tmp_path / "bench.yaml").write_text(yaml.safe_dump(cfg))
    out = tmp_path / "bench.json"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "qwenquant",
            "bench",
            "run",
            url,
            "--config",
            str(tmp_path / "bench.yaml"),
            "--prompts",
            "narrative",
            "--sampling",
            "greedy",
            "--thinking",
            "off",
            "--max-tokens",
            "8",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env=dict(os.environ, QWENQUANT_NO_PROGRESS="1"),
    )
    assert r.returncode == 0, r.stderr
    return json.loads(out.read_text())["targets"][0]["acceptance"]


@pytest.mark.parametrize("total_suffix", [True, False], ids=["with-_total", "without-_total"])
def test_eval_and_bench_report_the_same_acceptance(server, tmp_path: Path, total_suffix: bool) -> None:
    """The same server, counters exported with or without `_total`: `eval served` and `bench`
    report the same mean acceptance length and per-position rates (each request: 4 drafts, 6 accepted)."""
    s = server(total_suffix=total_suffix)
    assert ("_total{" in s.metrics_text()) == total_suffix
    proc = _eval(s.url, tmp_path)
    assert proc.returncode == 0, proc.stderr
    e = json.loads(proc.stdout)["mtp"]
    b = _bench_acceptance(s.url, tmp_path)
    assert e["mean_acceptance_length"] == b["mean_acceptance_length"] == pytest.approx(2.5)
    assert list(e["per_position"].values()) == pytest.approx(b["per_position"])
    assert b["per_position"] == pytest.approx([0.75, 0.5, 0.25])


def test_a_served_report_of_another_gate_or_server_is_not_replaced(server, tmp_path: Path) -> None:
    """The same gate on the same server replaces its own report; a report of another server (or
    gate) at --report is left alone, exit 2, and no request reaches the server."""
    s = server()
    report = tmp_path / "r.json"
    assert _eval(s.url, tmp_path, "--report", str(report)).returncode == 0
    assert _eval(s.url, tmp_path, "--report", str(report)).returncode == 0  # the same run again
    other = server()
    asked = len(other.bodies)
    before = report.read_bytes()
    proc = _eval(other.url, tmp_path, "--report", str(report))
    assert proc.returncode == 2, proc.stderr
    assert f"report {report} holds a report of another run" in " ".join(proc.stderr.split())
    assert report.read_bytes() == before and len(other.bodies) == asked


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("-1", "--min-acceptance-length -1 is below 1"),
        ("0.5", "--min-acceptance-length 0.5 is below 1"),
        (
            "99",
            "--min-acceptance-length 99 cannot be reached: the server drafts 3 tokens per step, so the mean "
            "acceptance length is at most 4",
        ),
    ],
)
def test_an_unreachable_min_acceptance_is_refused_before_any_request(
    server, tmp_path: Path, value: str, says: str
) -> None:
    """The mean acceptance length lies between 1 and the server's draft tokens + 1 (the stand-in's /metrics lists
    3 draft positions, as vLLM lists its per-position counters from the start): found out before the run."""
    s = server()
    proc = _eval(s.url, tmp_path, "--min-acceptance-length", value)
    assert proc.returncode == 2, proc.stderr
    assert says in " ".join(proc.stderr.split())
    assert s.bodies == []


def test_spec_check_against_a_url_needs_the_server_without_speculation(server, tmp_path: Path) -> None:
    """STAND-IN (module docstring): qwenquant cannot turn MTP off on a server it did not start, so --spec-check
    against a URL without --reference-url is refused (exit 2) before any request; a reference whose /metrics
    exports spec-decode counters drafts itself and is refused too, before the gate runs."""
    s = server()
    proc = _eval(s.url, tmp_path, "--spec-check")
    assert proc.returncode == 2, proc.stderr
    assert (
        "--spec-check against a URL needs the URL of the same model served without speculation"
        in " ".join(proc.stderr.split())
        and s.bodies == []
    )
    proc = _eval(s.url, tmp_path, "--spec-check", "--reference-url", server().url)
    assert proc.returncode == 2, proc.stderr
    assert "drafts (its /metrics exports vllm:spec_decode_* counters)" in " ".join(proc.stderr.split())
    assert s.bodies == []
