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
from qwenquant.bench.rates import sample_figures
from qwenquant.bench.runner import Target
from qwenquant.bench.stream import Sample
from qwenquant.bench.watch import ServerWatch
from qwenquant.errors import UsageError
from qwenquant.net.prometheus import queue_gauges

QUEUE_POLL_S = 0.1


def check_concurrency(concurrency: int, max_num_seqs: int | None, option: str = "--concurrency") -> None:
    """Streams beyond what the server runs at once (its profile's max_num_seqs) would queue, not run at
    once: refused (exit 2)."""
    if max_num_seqs is not None and concurrency > max_num_seqs:
        raise UsageError(f"{option} {concurrency} is above the profile's max_num_seqs {max_num_seqs}: the server "
                         f"would queue the rest", hint=f"use {option} {max_num_seqs} or less")


def burst_header(index: int, request: int, depth: int, nonce: str) -> str:
    """The first line of one request of a burst: unique per rung, request and run."""
    return f"# qwenquant bench --depth: rung {index} request {request} at {depth} tokens, run {nonce}\n"


def spread3(values: list[float]) -> dict[str, float] | None:
    """min / median / max (None when empty)."""
    if not values:
        return None
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


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


def _one(t: Target, msgs: list[dict[str, str]], opts: rung.DepthOptions, gate: threading.Barrier) -> tuple[Sample | None, str | None]:
    gate.wait()
    s, why = rung.stream_once(t, rung.chat_request(t, msgs, opts.output_tokens, opts.thinking), opts.stall_timeout)
    return s, why or (rung.empty_failure(s) if s else None)


def run_burst_rung(t: Target, watch: ServerWatch, fitter: rung.PromptFitter, depth: int, index: int, nonce: str,
                   opts: rung.DepthOptions) -> rung.RungResult:
    """One rung of N requests at once; a failure is recorded, never raised."""
    n = opts.concurrency
    fitted = [fitter.fit(depth, burst_header(index, j, depth, nonce), start=index * 7919 + j * 104729)
              for j in range(n)]
    rec: dict[str, Any] = {"depth": depth, "concurrency": n, "tokenize_count": [c for _, c in fitted]}
    before = metrics.scrape(t.url, t.api_key)
    gate = threading.Barrier(n)
    with MemoryPeak() as mem, QueueWatch(t) as queue, ThreadPoolExecutor(n) as pool:
        t0 = time.monotonic()
        results = list(pool.map(lambda m: _one(t, m[0], opts, gate), fitted))
        rec["seconds"] = time.monotonic() - t0
    rec["gpu_memory"] = mem.result
    rec["server_queue"] = queue.result
    samples = [s for s, _ in results if s is not None]
    rec["decoding_at_once"] = decoding_at_once(samples)
    rec["checks"] = queued_checks(queue.result, n, f"depth {depth}", rec["decoding_at_once"])
    after = metrics.scrape(t.url, t.api_key)
    rec["requests"] = [{**(rung.request_record(s, f"depth {depth}") if s else {}), "failure": why}
                       for j, (s, why) in enumerate(results)]
    rec.update(_burst_figures(samples))
    rec["acceptance"] = rung.acceptance_between(before, after)
    rec["failed"] = sum(1 for _, why in results if why)
    return rung.RungResult(depth, rec, rung.with_server_state(watch, burst_failure(n, [why for _, why in results]), after))


def _burst_figures(samples: list[Sample]) -> dict[str, Any]:
    """The rung's figures: TTFT the slowest request's (the burst's), rates the median request's."""
    figs = [sample_figures(s) for s in samples]
    ttft = spread3([f["ttft_s"] for f in figs if f.get("ttft_s") is not None])
    decode = spread3([f["decode_tok_s"] for f in figs if f.get("decode_tok_s") is not None])
    wall = spread3([f["wall_tok_s"] for f in figs if f.get("wall_tok_s") is not None])
    return {"ttft": ttft, "decode": decode, "ttft_s": ttft["max"] if ttft else None,
            "prefill_tok_s": aggregate_prefill(samples), "decode_tok_s": decode["median"] if decode else None,
            "wall_tok_s": wall["median"] if wall else None,
            "prompt_tokens": min((s.prompt_tokens for s in samples), default=None),
            "completion_tokens": min((s.completion_tokens for s in samples), default=None)}


class QueueWatch:
    """Reads the server's running and waiting requests from /metrics while a burst runs (a thread)."""

    def __init__(self, t: Target) -> None:
        self.t, self.stop = t, threading.Event()
        self.seen: list[tuple[float, float]] = []
        self.thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self.stop.is_set():
            page = metrics.scrape(self.t.url, self.t.api_key, timeout=5.0)
            got = queue_gauges(page) if page else None
            if got is None:
                return  # no /metrics, or not vLLM's gauges: the result says so
            self.seen.append(got)
            self.stop.wait(QUEUE_POLL_S)

    def __enter__(self) -> QueueWatch:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=10)

    @property
    def result(self) -> dict[str, Any] | None:
        """{"max_running", "max_waiting", "pages"}, or None when the server exports no queue gauges."""
        if not self.seen:
            return None
        return {"max_running": max(r for r, _ in self.seen), "max_waiting": max(w for _, w in self.seen),
                "pages": len(self.seen)}


def decoding_at_once(samples: list[Sample]) -> int:
    """The client's own count: the most streams that were between their first token and their end at one
    instant (pure). A server that queues a burst answers one request after another; one that runs them all
    decodes them side by side."""
    edges = sorted([(s.t_first, 1) for s in samples if s.t_first is not None] +
                   [(s.t_end, -1) for s in samples if s.t_first is not None], key=lambda e: (e[0], e[1]))
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def queued_checks(queue: dict[str, Any] | None, n: int, where: str, at_once: int = 0,
                  meant: str = "the rung measured a queue, not a burst of {n}") -> list[dict[str, Any]]:
    """A "queued" flag when the server held some of the burst's requests back and never ran all n at once
    (pure): its gauges are samples, so "never at once" takes both counts, the most running on a /metrics page
    and the most streams the client saw decoding side by side (`at_once`). Waiting alone is no queue: vLLM
    also counts a request as waiting until the step's token budget (max_num_batched_tokens) lets its prefill
    start, with every request admitted soon after."""
    if not queue or not queue["max_waiting"] or max(queue["max_running"], at_once) >= n:
        return []
    w, r = int(queue["max_waiting"]), int(max(queue["max_running"], at_once))
    return [{"kind": "cross-check", "check": "queued", "where": where, "figure": "waiting requests", "value": w,
             "line": 0, "note": f"{where}: up to {w} of the {n} requests waited in the server's queue (it ran at most "
                                f"{r} at once): " + meant.format(n=n)}]
