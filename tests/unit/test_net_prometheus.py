"""The one Prometheus reader (qwenquant.net.prometheus): vLLM's speculative-decoding counters are
found with and without the `_total` suffix, and `eval served` and `bench` compute the same MTP
figures from them (before this reader they disagreed on a page without `_total`)."""

from __future__ import annotations

import pytest

from qwenquant.bench.metrics import acceptance as bench_acceptance
from qwenquant.evaluate.served import acceptance as eval_acceptance
from qwenquant.net.prometheus import counter_base, samples, spec_counters


def page(drafts: float, tokens: float, accepted: float, pos: list[float], total: bool) -> str:
    """A vLLM-like /metrics page; `total` False exports the counters without the `_total` suffix."""
    sfx = "_total" if total else ""
    lab = 'engine="0",model_name="a,b\\"c}"'
    lines = [
        f"# HELP vllm:spec_decode_num_drafts{sfx} Number of spec decoding drafts.",
        f"# TYPE vllm:spec_decode_num_drafts{sfx} counter",
        f"vllm:spec_decode_num_drafts{sfx}{{{lab}}} {drafts}",
        f"vllm:spec_decode_num_drafts_created{{{lab}}} 1.7e+09",
        f"vllm:spec_decode_num_draft_tokens{sfx}{{{lab}}} {tokens}",
        f"vllm:spec_decode_num_accepted_tokens{sfx}{{{lab}}} {accepted} 1700000000000",
        'vllm:num_requests_running{engine="0"} 0.0',
    ]
    lines += [
        f'vllm:spec_decode_num_accepted_tokens_per_pos{sfx}{{{lab},position="{i}"}} {v}' for i, v in enumerate(pos)
    ]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("total", [True, False], ids=["with-_total", "without-_total"])
def test_eval_and_bench_read_the_same_acceptance(total: bool) -> None:
    before = spec_counters(page(100, 300, 50, [30, 15, 5], total))
    after = spec_counters(page(116, 348, 74, [42, 23, 9], total))
    assert after.present and (after.drafts, after.draft_tokens, after.accepted) == (116, 348, 74)
    e = eval_acceptance(before, after)
    b = bench_acceptance(after.minus(before))
    # 16 drafts, 48 draft tokens, 24 accepted: 1 + 24/16
    assert e["mean_acceptance_length"] == b["mean_acceptance_length"] == pytest.approx(2.5)
    assert list(e["per_position"].values()) == b["per_position"] == pytest.approx([0.75, 0.5, 0.25])
    assert (e["drafts"], e["draft_tokens"], e["accepted_tokens"]) == (16, 48, 24)


def test_pages_with_and_without_the_suffix_give_equal_counters() -> None:
    assert spec_counters(page(1, 2, 3, [4], True)) == spec_counters(page(1, 2, 3, [4], False))


def test_no_counters_and_no_drafts() -> None:
    none = spec_counters("vllm:num_requests_running 0\n")
    assert not none.present and none.mean_acceptance_length is None
    assert bench_acceptance(none).to_json() == {"metrics_page": True, "speculative": False, "counters": False}
    flat = spec_counters(page(10, 30, 5, [5], False))
    assert eval_acceptance(flat, flat)["mean_acceptance_length"] is None
    assert bench_acceptance(flat.minus(flat))["speculative"] is False


def test_samples_and_counter_names() -> None:
    got = list(samples('a_total{x="1",y="q\\"}"} 2.5\n# comment\nb 3 1700000\ngarbage line\nc{bad} 1\n'))
    assert got == [("a_total", {"x": "1", "y": 'q"}'}, 2.5), ("b", {}, 3.0)]
    assert (counter_base("x_total"), counter_base("x"), counter_base("x_created")) == ("x", "x", None)


def test_queue_gauges_sum_engines_and_say_when_absent() -> None:
    from qwenquant.net.prometheus import queue_gauges

    page = (
        'vllm:num_requests_running{engine="0",model_name="m"} 2.0\n'
        'vllm:num_requests_running{engine="1",model_name="m"} 1.0\n'
        'vllm:num_requests_waiting{engine="0",model_name="m"} 3.0\n'
    )
    assert queue_gauges(page) == (3.0, 3.0)
    assert queue_gauges('vllm:num_requests_running{engine="0"} 1\n') == (1.0, 0.0)
    assert queue_gauges("process_start_time_seconds 1.7e9\n") is None
