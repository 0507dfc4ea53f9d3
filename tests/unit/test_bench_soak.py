"""Pure parts of `qwenquant bench --soak`: windows of verify steps, merging streams, collapse and the verdict."""

from __future__ import annotations

import pytest

from qwenquant.bench.parts import SoakStream
from qwenquant.bench.soak import Restart, Window, collapse, merge_windows, step_windows, verdict


def test_steps_fall_in_the_window_of_their_first_token() -> None:
    # 3 steps of 3 tokens (2 accepted), then 2 steps of 1 token: tokens 0-8 | 9-10
    ws = step_windows([2, 2, 2, 0, 0], [3, 3, 3, 3, 3], window=6, first=0)
    assert [(w.index, w.start, w.end) for w in ws] == [(0, 0, 6), (1, 6, 11)]
    assert ws[0].record().per_position == [1.0, 1.0, 0.0] and ws[0].rate == pytest.approx(4 / 6)
    assert ws[1].drafts == 3 and ws[1].accepted == 2 and ws[1].record().per_position == [1 / 3, 1 / 3, 0.0]
    assert ws[1].record().mean_acceptance_length == pytest.approx(1 + 2 / 3)


def test_the_prefill_token_counts_in_the_first_window() -> None:
    ws = step_windows([2, 2, 2], [3, 3, 3], window=4)
    assert [(w.start, w.end, w.drafts) for w in ws] == [(0, 4, 1), (4, 10, 2)]
    assert step_windows([2, 2, 2], [3, 3, 3], window=4, total=9)[-1].end == 9  # drafts past max_tokens not sent


def test_merge_sums_streams_by_window() -> None:
    a = step_windows([2, 2], [3, 3], window=3, stream=0, first=0)
    b = step_windows([0, 0, 0], [3, 3, 3], window=3, stream=1, first=0)
    m = merge_windows([a, b])
    assert [(w.index, w.drafts, w.accepted, w.stream) for w in m] == [(0, 4, 2, None), (1, 1, 2, None)]
    assert m[0].per_pos == (1, 1, 0)


def _w(i: int, acc: float, dt: float = 30.0, start: int | None = None, end: int | None = None) -> Window:
    s = i * 100 if start is None else start
    return Window(i, s, s + 100 if end is None else end, dt / 3, dt, acc, (acc,))


def test_collapse_against_the_first_window() -> None:
    assert collapse([_w(0, 20), _w(1, 15), _w(2, 11)], 0.5, 100) is None
    w, why = collapse([_w(0, 20), _w(1, 15), _w(2, 9)], 0.5, 100)
    assert w.index == 2 and "below 0.5 x the first window's 0.667" in why
    w, why = collapse([_w(0, 20), _w(1, 0)], 0.1, 100)
    assert w.index == 1 and "no accepted drafts" in why
    assert collapse([_w(0, 20), _w(1, 0, end=120)], 0.5, 100) is None  # a 20-token tail is not judged
    assert collapse([_w(0, 20), _w(1, -5, dt=-30)], 0.5, 100) is None  # counters went back: a restart
    assert collapse([_w(0, 0, dt=0), _w(1, 0, dt=0)], 0.5, 100) is None  # nothing drafted: nothing to judge
    assert collapse([_w(0, 0), _w(1, 0)], 0.5, 100) is None  # nothing ever accepted: no collapse


def test_verdict_orders_failures_by_window_and_names_the_first() -> None:
    ok = SoakStream.model_validate(
        {"completion_tokens": 400, "streamed_tokens": 400, "finish_reason": "length", "error": None}
    )
    assert verdict([[_w(0, 20), _w(1, 20)]], [ok], None, 0.5, 100, 400).to_json() == {
        "status": "ok",
        "failures": [],
        "line": None,
        "acceptance_judged": True,
        "flags": [],
    }
    short = SoakStream(**{**ok.given(), "completion_tokens": 250})
    boom = SoakStream.model_validate({"error": "request failed", "streamed_tokens": 130, "completion_tokens": None})
    v = verdict(
        [[_w(0, 20), _w(1, 20), _w(2, 0)]],
        [short, boom, SoakStream(**{**ok.given(), "completion_tokens": 0})],
        Restart(3, "gone"),
        0.5,
        100,
        400,
    ).to_json()
    assert v["status"] == "failed"
    assert [f["kind"] for f in v["failures"]] == ["empty", "error", "collapse", "truncated", "restart"]
    assert v["line"] == "stream 2 came back empty (window 0: 0 tokens by usage)"
    assert "stream 1 failed in window 1 (after at least 130 streamed tokens)" in v["failures"][1]["line"]
    assert "stream 0 was truncated in window 2: 250 of 400 tokens by usage" in v["failures"][3]["line"]


def test_verdict_judges_truncation_from_the_exact_streamed_count_and_flags_usage() -> None:
    """With token ids the streamed count decides: a cut stream whose usage over-reports is truncated, a
    complete one whose usage under-reports passes; either disagreement is a flag of its own."""
    wins = [[_w(0, 20), _w(1, 20), _w(2, 20), _w(3, 20)]]
    cut = SoakStream.model_validate(
        {"completion_tokens": 400, "streamed_tokens": 250, "streamed_exact": True, "error": None}
    )
    v = verdict(wins, [cut], None, 0.5, 100, 400).to_json()
    assert v["status"] == "failed" and v["line"].startswith(
        "stream 0 was truncated in window 2: 250 of 400 tokens streamed"
    )
    whole = SoakStream.model_validate(
        {"completion_tokens": 300, "streamed_tokens": 400, "streamed_exact": True, "error": None}
    )
    v = verdict(wins, [whole], None, 0.5, 100, 400).to_json()
    assert v["status"] == "ok" and v["failures"] == []
    assert [f["note"] for f in v["flags"]] == [
        "stream 0: usage counts 300 completion tokens, the stream carried 400 token ids"
    ]


def test_no_drafts_is_not_judged_and_an_approximate_window_says_so() -> None:
    ok = SoakStream.model_validate(
        {"completion_tokens": 400, "streamed_tokens": 400, "streamed_exact": True, "error": None}
    )
    v = verdict([[_w(0, 0, dt=0), _w(1, 0, dt=0)]], [ok], None, 0.5, 100, 400).to_json()
    assert v["status"] == "not judged" and v["acceptance_judged"] is False
    assert v["line"].startswith("acceptance not judged: the server drafted no tokens")
    v = verdict([[_w(0, 20), _w(1, 0)]], [ok], None, 0.5, 100, 400, approximate=True).to_json()
    assert (
        v["status"] == "failed" and "about generated tokens 100-200" in v["line"] and "approximate count" in v["line"]
    )
