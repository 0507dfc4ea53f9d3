"""Pure parts of `bench --depth --concurrency` (bursts) and `bench --turns` (a conversation): the
refusal above max_num_seqs, the burst's aggregate prefill and TTFT spread, its failure line, the
prefix-cache counters on /metrics and the verdict on whether the server cached."""

from __future__ import annotations

import pytest
from test_bench_output import rung, turn, typed

from qwenquant.bench.burst import aggregate_prefill, burst_failure, burst_header, check_concurrency, spread3
from qwenquant.bench.parts import PrefixCache, QueueCounts, TurnRecord
from qwenquant.bench.render import burst_rows, cache_line
from qwenquant.bench.stream import Sample
from qwenquant.bench.turns import cache_delta, cache_verdict, fits, new_tokens
from qwenquant.errors import UsageError
from qwenquant.net.prometheus import prefix_cache_counters


def _s(sent: float, first: float | None, prompt: int) -> Sample:
    return Sample(
        t_sent=sent,
        t_first=first,
        t_end=(first or sent) + 1.0,
        prompt_tokens=prompt,
        completion_tokens=8,
        max_tokens=8,
        first_field="content",
    )


def test_a_burst_wider_than_max_num_seqs_is_refused() -> None:
    check_concurrency(16, 16)
    check_concurrency(64, None)  # a URL: the server's limit is unknown
    with pytest.raises(UsageError, match="--concurrency 17 is above the profile's max_num_seqs 16"):
        check_concurrency(17, 16)


def test_burst_prompts_have_unique_first_lines() -> None:
    heads = {burst_header(i, j, 4096, "ab12") for i in range(3) for j in range(16)}
    assert len(heads) == 48 and all(h.endswith("run ab12\n") for h in heads)


def test_aggregate_prefill_counts_every_prompt_over_the_burst_span() -> None:
    # 3 x 1000 tokens, sent from t=0.0/0.1, the last first token at 2.0: 3000 / 2.0
    assert aggregate_prefill([_s(0.0, 1.0, 1000), _s(0.1, 1.5, 1000), _s(0.05, 2.0, 1000)]) == pytest.approx(1500.0)
    assert aggregate_prefill([_s(0.0, 1.0, 1000), _s(0.0, None, 1000)]) is None  # one never answered
    assert aggregate_prefill([]) is None
    assert spread3([3.0, 1.0, 2.0, 10.0]).to_json() == {"min": 1.0, "median": 2.5, "max": 10.0} and spread3([]) is None


def test_burst_failure_says_how_many_of_n() -> None:
    assert burst_failure(4, [None, None, None, None]) is None
    assert burst_failure(4, [None, "stalled", None, "empty output"]) == "2 of 4 requests failed: stalled"
    row = burst_rows(
        typed(
            "depth",
            rungs=[
                rung(
                    depth=2048,
                    prompt_tokens=2047,
                    ttft={"min": 0.5, "median": 1.0, "max": 2.25},
                    prefill_tok_s=3640.0,
                    ok=False,
                    failed=1,
                    concurrency=4,
                    acceptance={"metrics_page": False, "speculative": None},
                    gpu_memory={"sampled": False},
                )
            ],
        )
    )[0]
    assert row[2] == "0.50/1.00/2.25" and row[3] == "3640" and row[-1] == "FAILED (1 of 4)"


PAGE = """# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 5000.0
vllm:prefix_cache_queries_created{engine="0",model_name="m"} 1.7e9
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 1200.0
vllm:prefix_cache_hits_total{engine="1",model_name="m"} 800.0
vllm:external_prefix_cache_hits_total{engine="0"} 99.0
"""


def test_prefix_cache_counters_with_or_without_total() -> None:
    assert prefix_cache_counters(PAGE) == {"queries": 5000.0, "hits": 2000.0}
    bare = 'vllm:prefix_cache_queries{engine="0"} 10\nvllm:prefix_cache_hits{engine="0"} 4\n'
    assert prefix_cache_counters(bare) == {"queries": 10.0, "hits": 4.0}
    assert prefix_cache_counters("vllm:num_requests_running 0\n") is None
    assert cache_delta(bare, PAGE).to_json() == {"queries": 4990.0, "hits": 1996.0}
    assert cache_delta(None, PAGE) is None and cache_delta(bare, "x 1\n") is None


def _turn(prefix_cache: dict[str, float] | None) -> TurnRecord:
    return TurnRecord.model_validate(turn(prefix_cache=prefix_cache))


def test_cache_verdict_reads_hits_after_the_first_turn() -> None:
    t0 = _turn({"queries": 2000.0, "hits": 0.0})
    hit = _turn({"queries": 4000.0, "hits": 2048.0})
    miss = _turn({"queries": 4000.0, "hits": 0.0})
    hits = {"counters": True, "cached": True, "hits": 4096.0, "queries": 8000.0}
    assert cache_verdict([t0, hit, hit]).to_json() == hits  # the counters' floats stay floats
    assert cache_verdict([t0, miss]).cached is False
    assert cache_verdict([_turn(None), _turn(None)]).counters is False
    assert cache_verdict([t0]).cached is None  # one turn says nothing about caching
    assert "the server cached (4096 of 8000" in cache_line(cache_verdict([t0, hit, hit]))
    assert "NO hits" in cache_line(cache_verdict([t0, miss])) and "unknown" in cache_line(PrefixCache(counters=False))
    off = _turn({"queries": 0.0, "hits": 0.0})  # vLLM with caching off: counters present, never moved
    assert cache_verdict([off, off]).cached is False and "prefix cache: off" in cache_line(cache_verdict([off, off]))


def test_turn_arithmetic() -> None:
    assert new_tokens(5000, 2900) == 2100 and new_tokens(2000, None) == 2000 and new_tokens(None, 10) is None
    assert fits(32704, 64, 32768) and not fits(32705, 64, 32768)


def test_a_burst_with_waiting_requests_is_flagged_queued() -> None:
    from qwenquant.bench.burst import queued_checks

    assert queued_checks(None, 4, "depth 1024") == []  # no gauges: nothing to hold the burst against
    assert queued_checks(QueueCounts(max_running=4, max_waiting=0, pages=9), 4, "depth 1024") == []
    # waiting for the step's token budget, then all four ran at once: no queue
    assert queued_checks(QueueCounts(max_running=4, max_waiting=3, pages=9), 4, "depth 1024") == []
    # the pages missed the moment all four ran, but the client saw four streams decoding side by side
    assert queued_checks(QueueCounts(max_running=1, max_waiting=3, pages=2), 4, "depth 1024", 4) == []
    (f,) = queued_checks(QueueCounts(max_running=1, max_waiting=3, pages=9), 4, "depth 1024", 1)
    assert f["check"] == "queued" and f["value"] == 3
    assert f["note"] == (
        "depth 1024: up to 3 of the 4 requests waited in the server's queue (it ran at most 1 at "
        "once): the rung measured a queue, not a burst of 4"
    )


def test_streams_decoding_at_once_are_counted_from_the_client_clock() -> None:
    from qwenquant.bench.burst import decoding_at_once
    from qwenquant.bench.stream import Sample

    def s(first: float | None, end: float) -> Sample:
        return Sample(
            t_sent=0.0,
            t_first=first,
            t_end=end,
            prompt_tokens=1,
            completion_tokens=1,
            max_tokens=1,
            first_field="content",
        )

    assert decoding_at_once([]) == 0
    assert decoding_at_once([s(1, 2), s(2, 3), s(3, 4)]) == 1  # one after another: an end and a start at one instant
    assert decoding_at_once([s(1, 3), s(2, 4), s(2.5, 5)]) == 3
    assert decoding_at_once([s(1, 3), s(None, 4), s(3.5, 5)]) == 1  # a stream without a first token never decoded
