"""Streams meant to run at once that the server queued (a burst's rung, a soak's streams, a wave of the
run's concurrency ladder): the server's running and waiting gauges read from /metrics while they run, the
client's own count of streams decoding side by side, and the "queued" flag both give (pure but for the
watch's thread)."""

from __future__ import annotations

import threading
from typing import Any

from qwenquant.bench import metrics
from qwenquant.bench.parts import Flag, QueueCounts
from qwenquant.bench.stream import Sample
from qwenquant.net.prometheus import queue_gauges

QUEUE_POLL_S = 0.1


class QueueWatch:
    """Reads the server's running and waiting requests from /metrics while a burst runs (a thread)."""

    def __init__(self, t: Any) -> None:  # a runner.Target
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
    def result(self) -> QueueCounts | None:
        """The most running and waiting requests and the pages read, or None when the server exports no
        queue gauges."""
        if not self.seen:
            return None
        return QueueCounts(
            max_running=max(r for r, _ in self.seen), max_waiting=max(w for _, w in self.seen), pages=len(self.seen)
        )


def decoding_at_once(samples: list[Sample]) -> int:
    """The client's own count: the most streams that were between their first token and their end at one
    instant (pure). A server that queues a burst answers one request after another; one that runs them all
    decodes them side by side."""
    edges = sorted(
        [(s.t_first, 1) for s in samples if s.t_first is not None]
        + [(s.t_end, -1) for s in samples if s.t_first is not None],
        key=lambda e: (e[0], e[1]),
    )
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def queued_checks(
    queue: QueueCounts | None,
    n: int,
    where: str,
    at_once: int = 0,
    meant: str = "the rung measured a queue, not a burst of {n}",
) -> list[Flag]:
    """A "queued" flag when the server held some of the burst's requests back and never ran all n at once
    (pure): its gauges are samples, so "never at once" takes both counts, the most running on a /metrics page
    and the most streams the client saw decoding side by side (`at_once`). Waiting alone is no queue: vLLM
    also counts a request as waiting until the step's token budget (max_num_batched_tokens) lets its prefill
    start, with every request admitted soon after."""
    if not queue or not queue.max_waiting or max(queue.max_running, at_once) >= n:
        return []
    w, r = int(queue.max_waiting), int(max(queue.max_running, at_once))
    return [
        Flag(
            kind="cross-check",
            check="queued",
            where=where,
            figure="waiting requests",
            value=w,
            line=0,
            note=f"{where}: up to {w} of the {n} requests waited in the server's queue (it ran at most "
            f"{r} at once): " + meant.format(n=n),
        )
    ]
