"""`qwenquant eval served` against a server that is not quite what it expects: a base URL ending in
/v1, /v1/models without `data`, an API key it lacks, no /metrics; a run that would test nothing; a
report path that fills up after measuring.

STAND-IN: the server is tests/integration/standin_eval.py (standin.py with those faults) in the test
process, not vLLM: a real vLLM always serves /metrics and a well-formed /v1/models, and its drafts
cannot be chosen. test_eval_vllm.py and test_serve_vllm.py run eval against a real vLLM.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from standin_eval import EvalStandin

from helpers import qq


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("QWENQUANT_API_KEY", raising=False)  # the 401 test sends no key unless told to
    with EvalStandin() as s:
        yield s


def _eval(url: str, *extra: str) -> subprocess.CompletedProcess:
    return qq("eval", "served", url, *extra, timeout=120)


def _line(proc: subprocess.CompletedProcess, prefix: str) -> str:
    lines = [" ".join(ln.split()) for ln in proc.stderr.splitlines() if ln.startswith(prefix)]
    assert len(lines) == 1, proc.stderr
    return lines[0]


@pytest.mark.parametrize("suffix", ["/v1", "/v1/"])
def test_a_base_url_ending_in_v1_is_not_doubled(standin, suffix: str) -> None:
    proc = _eval(standin.url + suffix, "--gate", "none", "--tools", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["url"] == standin.url and out["model"] == "standin" and out["mtp"]["metrics_present"] is True
    assert len([b for b in standin.bodies if b.get("tools")]) == 6


@pytest.mark.parametrize("body", [{"object": "list"}, [], {"data": "standin"}])
def test_models_without_a_data_list_is_a_measurement_error(standin, body) -> None:
    standin.models_body = body
    proc = _eval(standin.url, "--gate", "none", "--tools")
    assert proc.returncode == 8, proc.stderr
    assert f"GET {standin.url}/v1/models answered without a `data` list of models" in _line(proc, "error:")
    assert "pass --model NAME" in _line(proc, "hint:")
    assert standin.bodies == []


def test_a_401_hints_at_the_api_key_not_at_the_server(standin) -> None:
    standin.api_key = "the-key"
    proc = _eval(standin.url, "--gate", "none", "--tools")
    assert proc.returncode == 8, proc.stderr
    assert "answered 401" in _line(proc, "error:")
    hint = _line(proc, "hint:")
    assert "pass --api-key KEY (or set QWENQUANT_API_KEY)" in hint and "server is up" not in hint
    proc = _eval(standin.url, "--api-key", "another-key", "--gate", "none", "--tools")
    assert proc.returncode == 8
    assert "the server refused the API key" in _line(proc, "hint:")
    assert _eval(standin.url, "--api-key", "the-key", "--gate", "none", "--tools").returncode == 0


def test_tools_run_without_metrics_unless_acceptance_is_asked(standin) -> None:
    standin.metrics_status = 404
    proc = _eval(standin.url, "--gate", "none", "--tools", "--json")
    assert proc.returncode == 0, proc.stderr
    m = json.loads(proc.stdout)["mtp"]
    assert m["unavailable"] == f"GET {standin.url}/metrics answered 404" and m["mean_acceptance_length"] is None
    assert f"MTP: not measured (GET {standin.url}/metrics answered 404)" in proc.stderr
    proc = _eval(standin.url, "--gate", "none", "--tools", "--min-acceptance-length", "1.5")
    assert proc.returncode == 8
    assert f"MTP acceptance cannot be judged: GET {standin.url}/metrics answered 404" in _line(proc, "error:")


def test_acceptance_is_counted_over_the_tool_cases_that_ran(standin) -> None:
    """--gate none --tools: the counters are read before the first tool case and after the last (6
    cases, 4 drafts and 6 accepted tokens each: 1 + 36/24 = 2.5), not around the empty gate."""
    standin.chat_drafts = True
    proc = _eval(standin.url, "--gate", "none", "--tools", "--min-acceptance-length", "2.4", "--json")
    assert proc.returncode == 0, proc.stderr
    m = json.loads(proc.stdout)["mtp"]
    assert (m["drafts"], m["accepted_tokens"], m["mean_acceptance_length"]) == (24, 36, 2.5)
    assert m["over"] == ["tool cases"]
    assert "MTP over the tool cases: 24 drafts" in proc.stderr


@pytest.mark.parametrize(
    "extra, message",
    [
        ((), "--gate none with neither --tools nor --needle tests nothing"),
        (
            ("--min-acceptance-length", "1.2"),
            "--gate none with neither --tools nor --needle tests nothing (MTP acceptance "
            "would be measured over no request)",
        ),
        (
            ("--needle", "--needle-max-len", "-5"),
            "--needle-max-len -5 leaves no needle case: a case needs at least 152 tokens",
        ),
        (("--needle", "--needle-max-len", "100"), "--needle-max-len 100 leaves no needle case"),
        (("--tools", "--needle-max-len", "4096"), "--needle-max-len without --needle"),
    ],
)
def test_a_run_that_would_test_nothing_is_refused_before_asking(standin, extra: tuple[str, ...], message: str) -> None:
    proc = _eval(standin.url, "--gate", "none", *extra)
    assert proc.returncode == 2, proc.stderr
    assert message in _line(proc, "error:")
    assert standin.bodies == []


def test_a_report_write_that_fails_after_measuring_keeps_the_measurement(standin) -> None:
    """/dev/full accepts the open and fails the write (ENOSPC), as a disk that fills up while eval
    measures: the report is printed on stdout and kept in a spare file, exit 2 naming the path."""
    proc = _eval(standin.url, "--gate", "none", "--tools", "--report", "/dev/full")
    assert proc.returncode == 2, proc.stderr
    assert [c["ok"] for c in json.loads(proc.stdout)["tools"]["cases"]] == [True] * 6
    note = _line(proc, "report:")
    assert note.startswith("report: could not write /dev/full (No space left on device); the report went to ")
    spare = Path(note.split(" went to ")[1].split(" instead")[0])
    try:
        assert json.loads(spare.read_text()) == json.loads(proc.stdout)
    finally:
        spare.unlink()
    assert "report /dev/full could not be written (No space left on device)" in _line(proc, "error:")
