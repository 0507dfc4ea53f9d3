"""`qwenquant bench depth --concurrency N`: each rung a burst of N fresh prompts of its depth, sent
at the same instant (a barrier releases the N streams together).

Every request of a burst has a first line of its own (rung, request, depth, run nonce) and starts at
another place of the shipped text, so no request can reuse another's prefix-cache blocks: the server
prefills N x depth new tokens at once, the worst step a profile's max_num_seqs allows. Per rung: the
aggregate prefill rate (all prompt tokens / from the first request sent to the last first token),
each request's TTFT (min / median / max), decode rates, MTP acceptance and the GPU peak. A rung fails
when any of its requests fails (the failure kinds of depth.py); the report says how many of N.

A burst wider than what the server runs at once measures a queue: /metrics is read while the rung runs,
and a rung whose requests waited (`vllm:num_requests_waiting`) while the server never ran all of them at
once (`vllm:num_requests_running`, and the client's own count of streams decoding side by side) is flagged "queued", whatever the server lists as its max_num_seqs
(vLLM's /v1/models does not say).
"""

from __future__ import annotations

import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from qwenquant.bench import metrics, rung
from qwenquant.bench.gpu import MemoryPeak
from qwenquant.bench.parts import BurstRequest, DepthRung, Range
from qwenquant.bench.queued import QueueWatch, decoding_at_once, queued_checks
from qwenquant.bench.rates import sample_figures
from qwenquant.bench.runner import Target
from qwenquant.bench.stream import Sample
from qwenquant.bench.watch import ServerWatch
from qwenquant.errors import UsageError

__all__ = ["QueueWatch", "burst_failure", "check_concurrency", "decoding_at_once", "queued_checks", "run_burst_rung"]


def check_concurrency(concurrency: int, max_num_seqs: int | None, option: str = "--concurrency") -> None:
    """Streams beyond what the server runs at once (its profile's max_num_seqs) would queue, not run at
    once: refused (exit 2)."""
    if max_num_seqs is not None and concurrency > max_num_seqs:
        raise UsageError(
            f"{option} {concurrency} is above the profile's max_num_seqs {max_num_seqs}: the server "
            f"would queue the rest",
            hint=f"use {option} {max_num_seqs} or less",
        )


def burst_header(index: int, request: int, depth: int, nonce: str) -> str:
    """The first line of one request of a burst: unique per rung, request and run."""
    return f"# qwenquant bench --depth: rung {index} request {request} at {depth} tokens, run {nonce}\n"


def spread3(values: list[float]) -> Range | None:
    """min / median / max (None when empty)."""
    if not values:
        return None
    return Range(min=min(values), median=statistics.median(values), max=max(values))


def aggregate_prefill(samples: list[Sample]) -> float | None:
    """All prompt tokens of a burst / seconds from its first request sent to its last first token."""
    firsts = [s.t_first for s in samples if s.t_first is not None]
    if not samples or len(firsts) < len(samples):
        return None
    span = max(firsts) - min(s.t_sent for s in samples)
    return sum(s.prompt_tokens for s in samples) / span if span > 0 else None


def burst_failure(n: int, reasons: list[str | None]) -> str | None:
    """'k of N requests failed: <the first reason>' or None when all worked."""
    bad = [r for r in reasons if r]
    if not bad:
        return None
    return f"{len(bad)} of {n} requests failed: {bad[0]}"


def _one(
    t: Target, msgs: list[dict[str, str]], opts: rung.DepthOptions, gate: threading.Barrier
) -> tuple[Sample | None, str | None]:
    gate.wait()
    s, why = rung.stream_once(t, rung.chat_request(t, msgs, opts.output_tokens, opts.thinking), opts.stall_timeout)
    return s, why or (rung.empty_failure(s) if s else None)


def run_burst_rung(
    t: Target,
    watch: ServerWatch,
    fitter: rung.PromptFitter,
    depth: int,
    index: int,
    nonce: str,
    opts: rung.DepthOptions,
) -> rung.RungResult:
    """One rung of N requests at once; a failure is recorded, never raised."""
    n = opts.concurrency
    fitted = [
        fitter.fit(depth, burst_header(index, j, depth, nonce), start=index * 7919 + j * 104729) for j in range(n)
    ]
    before = metrics.scrape(t.url, t.api_key)
    gate = threading.Barrier(n)
    with MemoryPeak() as mem, QueueWatch(t) as queue, ThreadPoolExecutor(n) as pool:
        t0 = time.monotonic()
        results = list(pool.map(lambda m: _one(t, m[0], opts, gate), fitted))
        seconds = time.monotonic() - t0
    samples = [s for s, _ in results if s is not None]
    at_once = decoding_at_once(samples)
    after = metrics.scrape(t.url, t.api_key)
    failure = rung.with_server_state(watch, burst_failure(n, [why for _, why in results]), after)
    rec = DepthRung(
        depth=depth,
        concurrency=n,
        tokenize_count=[c for _, c in fitted],
        seconds=seconds,
        gpu_memory=mem.result,
        server_queue=queue.result,
        decoding_at_once=at_once,
        checks=queued_checks(queue.result, n, f"depth {depth}", at_once),
        requests=[
            BurstRequest(**(rung.request_record(s, f"depth {depth}").given() if s else {}), failure=why)
            for s, why in results
        ],
        **_burst_figures(samples),
        acceptance=rung.acceptance_between(before, after),
        failed=sum(1 for _, why in results if why),
        ok=failure is None,
    )
    return rung.RungResult(depth, rec, failure)


def _burst_figures(samples: list[Sample]) -> dict[str, Any]:
    """The rung's figures: TTFT the slowest request's (the burst's), rates the median request's."""
    figs = [sample_figures(s) for s in samples]
    ttft = spread3([x for f in figs if (x := f["ttft_s"]) is not None])
    decode = spread3([x for f in figs if (x := f["decode_tok_s"]) is not None])
    wall = spread3([x for f in figs if (x := f["wall_tok_s"]) is not None])
    return {
        "ttft": ttft,
        "decode": decode,
        "ttft_s": ttft.max if ttft else None,
        "prefill_tok_s": aggregate_prefill(samples),
        "decode_tok_s": decode.median if decode else None,
        "wall_tok_s": wall.median if wall else None,
        "prompt_tokens": min((s.prompt_tokens for s in samples), default=None),
        "completion_tokens": min((s.completion_tokens for s in samples), default=None),
    }
