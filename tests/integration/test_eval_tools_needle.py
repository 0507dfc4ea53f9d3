"""`qwenquant eval served URL --tools / --needle` against a stand-in server: each verdict fires.

STAND-IN: the server is tests/integration/standin.py (chat answers in standin_chat.py) in the test
process, not vLLM: a real server cannot be told to return a malformed tool call, arguments that miss
the schema, or to miss the needle from a chosen depth on. The real vLLM CPU server runs the same
commands end to end in test_serve_vllm.py (its text-only server).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from standin import StandinServer

from qwenquant.evaluate.specs import tools_spec
from qwenquant.evaluate.tools import judge, schema_problems

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def standin():
    with StandinServer() as s:
        yield s


def _eval(url: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "qwenquant", "eval", "served", url, "--gate", "none", "--json", *extra],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env=dict(os.environ),
    )


def _error_line(proc: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, proc.stderr
    return lines[0]


CASES = ["no-argument", "no-argument-required", "required-argument", "nested-json", "none", "named-function"]


@pytest.mark.parametrize(
    "mode, kinds",
    [
        ("answer", ["answer", "tool_call", "answer", "answer", "answer", "tool_call"]),
        ("call", ["tool_call", "tool_call", "tool_call", "tool_call", "answer", "tool_call"]),
    ],
)
def test_well_formed_calls_and_plain_answers_pass(standin, mode: str, kinds: list[str]) -> None:
    """A server that honours tool_choice: calls where it is required or named, plain text under none."""
    standin.tool_mode = mode
    proc = _eval(standin.url, "--tools")
    assert proc.returncode == 0, proc.stderr
    cases = json.loads(proc.stdout)["tools"]["cases"]
    assert [(c["name"], c["kind"], c["ok"]) for c in cases] == [(n, k, True) for n, k in zip(CASES, kinds, strict=True)]
    assert cases[5]["calls"][0]["name"] == "get_weather"  # the named function, not the first sent tool
    sent = [b for b in standin.bodies if b.get("tools")]
    assert [b["tools"][0]["function"]["name"] for b in sent] == [
        "get_current_time",
        "get_current_time",
        "get_weather",
        "create_event",
        "get_weather",
        "get_current_time",
    ]
    assert [b["tool_choice"] for b in sent] == [
        "auto",
        "required",
        "auto",
        "auto",
        "none",
        {"type": "function", "function": {"name": "get_weather"}},
    ]
    assert all(b["temperature"] == 0.0 and b["chat_template_kwargs"] == {"enable_thinking": False} for b in sent)
    assert f"tool case nested-json: {kinds[3].replace('_', ' ')}" in proc.stderr


@pytest.mark.parametrize(
    "mode, problem",
    [
        ("malformed", "tool case no-argument: malformed tool call: call 0 (get_current_time): arguments are not JSON"),
        (
            "mismatch",
            "tool case required-argument: malformed tool call: call 0 (get_weather): arguments lacks required 'city'",
        ),
        ("markup", "tool case no-argument: malformed tool call: tool-call markup left in the text"),
    ],
)
def test_a_malformed_call_fails_the_gate_naming_the_case(standin, mode: str, problem: str) -> None:
    standin.tool_mode = mode
    proc = _eval(standin.url, "--tools")
    assert proc.returncode == 8
    line = _error_line(proc)
    assert problem in line, line
    assert json.loads(proc.stdout)["ok"] is False


@pytest.mark.parametrize(
    "mode, problems",
    [
        (
            "plain-always",
            [
                "tool case no-argument-required: ignored tool_choice: tool_choice required, yet the answer is "
                "plain text, not a tool call",
                "tool case named-function: ignored tool_choice: tool_choice names get_weather, yet the answer is "
                "plain text, not a call of get_weather",
            ],
        ),
        (
            "call-always",
            [
                "tool case none: ignored tool_choice: tool_choice none, yet the answer calls get_weather",
                "tool case named-function: ignored tool_choice: tool_choice names get_weather, yet call 0 names "
                "'get_current_time'",
            ],
        ),
        (
            "object-arguments",
            [
                "tool case no-argument: malformed tool call: call 0 (get_current_time): arguments are a JSON "
                "dict, not a string of JSON (OpenAI sends them encoded): {}",
                "tool case nested-json: malformed tool call: call 0 (create_event): arguments are a JSON "
                "dict, not a string of JSON",
            ],
        ),
    ],
)
def test_an_answer_that_breaks_tool_choice_or_the_arguments_encoding_fails(
    standin, mode: str, problems: list[str]
) -> None:
    """A plain answer to `required` or to a named function, a call under `none` or of another function,
    `arguments` sent as a JSON object: each fails (exit 8) naming the case and the rule it broke."""
    standin.tool_mode = mode
    proc = _eval(standin.url, "--tools")
    assert proc.returncode == 8, proc.stderr
    line = " ".join(_error_line(proc).split())
    for problem in problems:
        assert problem in line, line
    assert json.loads(proc.stdout)["ok"] is False


def test_schema_subset_checker_on_nested_arguments() -> None:
    tools = tools_spec().cases[3].tools
    schema = tools[0].function.parameters or {}
    good = {"title": "Q3", "when": {"date": "2026-03-14", "time": "10:00"}, "attendees": [{"name": "Ana"}]}
    assert schema_problems(good, schema) == []
    bad = {"title": 3, "when": {"time": "10:00"}, "attendees": [{"email": "a@b"}], "reminder_minutes": True, "x": 1}
    assert sorted(schema_problems(bad, schema)) == sorted(
        [
            "arguments has 'x', which the schema does not allow",
            "arguments.title is int 3, not string",
            "arguments.when lacks required 'date'",
            "arguments.attendees[0] lacks required 'name'",
            "arguments.reminder_minutes is bool true, not integer",
        ]
    )
    call = {"tool_calls": [{"type": "function", "function": {"name": "delete_all", "arguments": "{}"}}]}
    assert judge(call, tools).problems == ["call 0 names 'delete_all', which was not sent (sent: create_event)"]
    # additionalProperties as a schema: every extra key must match it
    assert schema_problems({"a": 1, "b": "x"}, {"type": "object", "additionalProperties": {"type": "integer"}}) == [
        'arguments.b is str "x", not integer'
    ]


def test_needle_passes_at_every_depth_counted_by_the_server(standin) -> None:
    standin.max_model_len = 4096
    proc = _eval(standin.url, "--needle")
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)["needle"]
    # 1024, 2048, then the promised 4096 less the 24 answer tokens; three depths each
    assert rep["limit"] == 4072 and rep["total"] == 9 and rep["passed"] == 9
    rows = rep["depths"]
    assert [r["depth"] for r in rows] == [0.1, 0.5, 0.9] * 3
    # the prompt size is the server's count (usage.prompt_tokens), within a sentence of each rung
    for r, target in zip(rows, [1024] * 3 + [2048] * 3 + [4072] * 3, strict=True):
        assert target - 40 <= r["prompt_tokens"] <= target, r
        assert r["needle_tokens"] == pytest.approx(r["depth"] * r["prompt_tokens"], abs=40)
    assert len({r["expect"] for r in rows}) == 9  # a different code in every case


def test_a_missed_needle_fails_naming_the_depth(standin) -> None:
    standin.max_model_len, standin.needle_fail_from = 4096, 3000
    proc = _eval(standin.url, "--needle")
    assert proc.returncode == 8
    rows = json.loads(proc.stdout)["needle"]["depths"]
    assert [r["passed"] for r in rows] == [True] * 6 + [False] * 3
    line = _error_line(proc)
    first = rows[6]
    assert (
        f"needle at depth {first['needle_tokens']:,} of {first['prompt_tokens']:,} tokens (0.1): answer '000000' "
        f"lacks {first['expect']}"
    ) in line
    assert line.count("needle at depth") == 3
    assert "no depth passed" not in line


def test_a_model_that_misses_every_depth_is_told_why(standin) -> None:
    """The `eval --help` needle example on the demo's tiny model: every depth missed, and the line
    says the task needs an instruction-following model."""
    standin.max_model_len, standin.needle_fail_from = 2048, 0
    proc = _eval(standin.url, "--needle")
    assert proc.returncode == 8
    line = " ".join(_error_line(proc).split())
    assert (
        "no depth passed: the model never answered with the code. The needle task asks a question in chat, so it "
        "measures an instruction-following model; the demo's tiny model, trained on Python source only, misses "
        "every depth"
    ) in line
    assert line.count("needle at depth") == 6


def test_the_tool_task_is_not_an_exact_match_gate(standin) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "qwenquant", "eval", "served", standin.url, "--gate", "tools"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env=dict(os.environ),
    )
    assert proc.returncode == 2
    assert "gate 'tools' has no exact-match tasks" in _error_line(proc)
