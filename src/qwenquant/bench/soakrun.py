"""`qwenquant bench soak`: long generations on one server, acceptance per window, a verdict (soak.py).

Every stream sends a short prompt of the shipped text and asks for --tokens tokens (greedy,
ignore_eos, `return_token_ids` so the streamed tokens are counted exactly where vLLM sends them).
/metrics is scraped at the start, whenever the streamed tokens of all streams cross a window
boundary, and at the end; the per-request metrics replace those windows where every stream has them.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from qwenquant.bench import metrics
from qwenquant.bench.burst import check_concurrency
from qwenquant.bench.longtext import INSTRUCTION, LongText
from qwenquant.bench.modes import LongHead, SoakReport
from qwenquant.bench.parts import SoakStream
from qwenquant.bench.queued import QueueWatch, decoding_at_once, queued_checks
from qwenquant.bench.rung import (
    PromptFitter,
    chat_request,
    max_num_seqs,
    request_record,
    served_max_len,
    stream_once,
)
from qwenquant.bench.runner import Target
from qwenquant.bench.soak import Restart, Window, merge_windows, step_windows, verdict
from qwenquant.bench.stream import Sample, chunk_tokens
from qwenquant.bench.watch import ServerWatch
from qwenquant.errors import UsageError
from qwenquant.net.prometheus import SpecCounters, spec_counters

log = logging.getLogger(__name__)
PROMPT_CHARS = 1500


@dataclass(frozen=True)
class SoakOptions:
    tokens: int = 20000
    concurrency: int = 1
    window: int = 1024
    fraction: float = 0.5
    stall_timeout: float = 300.0
    thinking: bool | None = False


class Progress:
    """Tokens streamed so far (all streams) and the /metrics scrapes taken at window boundaries."""

    def __init__(self, t: Target, watch: ServerWatch, opts: SoakOptions) -> None:
        self.t, self.watch, self.opts = t, watch, opts
        self.lock = threading.Lock()
        self.streamed = [0] * opts.concurrency
        self.approximate = False
        self.scrapes: list[tuple[int, SpecCounters]] = []
        self.restart: Restart | None = None
        self.step = opts.window * opts.concurrency
        self.next = self.step
        self.scrape()

    def per_stream(self) -> int:
        return sum(self.streamed) // self.opts.concurrency

    def scrape(self) -> None:
        page = metrics.scrape(self.t.url, self.t.api_key)
        if page is None:
            return
        why = self.watch.seen_page(page)
        if why and self.restart is None:  # it happened in the window that this scrape ends
            since = self.scrapes[-1][0] if self.scrapes else 0
            self.restart = Restart(since // self.opts.window, why)
        self.scrapes.append((self.per_stream(), spec_counters(page)))

    def on_chunk(self, i: int, chunk: dict[str, Any]) -> None:
        n, exact = chunk_tokens(chunk)
        self.approximate = self.approximate or (n > 0 and not exact)
        if not n:
            return
        with self.lock:
            self.streamed[i] += n
            if sum(self.streamed) >= self.next:
                while self.next <= sum(self.streamed):
                    self.next += self.step
                self.scrape()

    def windows(self) -> list[Window]:
        out = []
        pairs = [
            (a, before, b, after)
            for (a, before), (b, after) in zip(self.scrapes, self.scrapes[1:], strict=False)
            if b > a
        ]  # the end's scrape after the last boundary may add no tokens
        for i, (a, before, b, after) in enumerate(pairs):
            d = after.minus(before)
            k = max(d.per_pos, default=-1) + 1
            out.append(
                Window(i, a, b, d.drafts, d.draft_tokens, d.accepted, tuple(d.per_pos.get(p, 0.0) for p in range(k)))
            )
        return out


def _body(t: Target, text: LongText, i: int, opts: SoakOptions) -> dict[str, Any]:
    msg = f"# stream {i}\n" + text.take(PROMPT_CHARS, start=i * 7919) + INSTRUCTION
    return chat_request(t, [{"role": "user", "content": msg}], opts.tokens, opts.thinking)


def _stream_record(i: int, s: Sample | None, error: str | None, streamed: int, exact: bool) -> SoakStream:
    """One stream: its figures and cross-checks, and the tokens it streamed as the soak counted them
    (exact with token ids, else a floor: one per chunk with text)."""
    measured = request_record(s, f"stream {i}").given() if s is not None else {}
    return SoakStream(error=error, **{**measured, "streamed_tokens": streamed, "streamed_exact": exact})


def _per_request(samples: list[Sample | None], window: int) -> list[list[Window]] | None:
    """Each stream's windows from vLLM's per-request metrics (detailed), or None if any stream lacks them."""
    out = []
    for i, s in enumerate(samples):
        spec = ((s.metrics or {}).get("speculative_decoding") or {}) if s else {}
        acc, drafted = spec.get("per_step_accepted"), spec.get("per_step_drafted")
        if not isinstance(acc, list) or not isinstance(drafted, list):
            return None
        out.append(step_windows(acc, drafted, window, stream=i, total=s.completion_tokens if s else None))
    return out


def check_options(t: Target, text: LongText, opts: SoakOptions) -> int | None:
    """The server's max_model_len; UsageError when the soak cannot fit on it: the longest stream's prompt as
    the server's /tokenize counts it, else (no /tokenize) as estimated from its characters, says so."""
    check_concurrency(opts.concurrency, max_num_seqs(t))
    max_len = served_max_len(t)
    if max_len is None:
        return None
    fitter = PromptFitter(t, text, opts.thinking)
    counts = [fitter.count(_body(t, text, i, opts)["messages"]) for i in range(opts.concurrency)]
    exact = None not in counts
    prompt = max(c for c in counts if c is not None) if exact else PROMPT_CHARS // 2
    if opts.tokens + prompt > max_len:
        what = (
            f"the prompt ({prompt} tokens by the server's /tokenize)"
            if exact
            else f"the prompt (about {prompt} tokens: the server has no /tokenize to count it)"
        )
        raise UsageError(
            f"--tokens {opts.tokens} plus {what} does not fit the server's max_model_len {max_len}",
            hint=f"use --tokens {max(1, max_len - prompt)} or less, or serve a longer context",
        )
    return max_len


def _streams(
    t: Target, text: LongText, opts: SoakOptions, prog: Progress
) -> tuple[list[Sample | None], list[str | None], QueueWatch]:
    """The soak's streams, run at once (each its sample or its error), with the server's queue watched
    where there are several."""
    samples: list[Sample | None] = [None] * opts.concurrency
    errors: list[str | None] = [None] * opts.concurrency

    def one(i: int) -> None:
        samples[i], errors[i] = stream_once(
            t, _body(t, text, i, opts), opts.stall_timeout, lambda c: prog.on_chunk(i, c)
        )

    queue = QueueWatch(t)  # watched only where streams are meant to run at once
    with queue if opts.concurrency > 1 else contextlib.nullcontext(), ThreadPoolExecutor(opts.concurrency) as pool:
        list(pool.map(one, range(opts.concurrency)))
    return samples, errors, queue


def run_soak(t: Target, text: LongText, opts: SoakOptions, head: LongHead) -> SoakReport:
    """The soak on one server: its report (`head`: who ran it, against what)."""
    max_len = check_options(t, text, opts)
    watch = ServerWatch(t.url, t.api_key, t.server)
    prog = Progress(t, watch, opts)
    samples, errors, queue = _streams(t, text, opts, prog)
    at_once = decoding_at_once([s for s in samples if s is not None])
    queued = queued_checks(
        queue.result,
        opts.concurrency,
        "soak",
        at_once,
        "the soak measured a queue, not {n} streams at once (its windows mix the streams)",
    )
    with prog.lock:
        prog.scrape()
    why = watch.problem()
    if why and prog.restart is None:
        prog.restart = Restart(prog.per_stream() // opts.window, why)
    exact = _per_request(samples, opts.window)
    per_stream = exact if exact is not None else [prog.windows()]
    streams = [
        _stream_record(i, s, e, n, not prog.approximate)
        for i, (s, e, n) in enumerate(zip(samples, errors, prog.streamed, strict=True))
    ]
    judged = verdict(
        per_stream,
        streams,
        prog.restart,
        opts.fraction,
        opts.window,
        opts.tokens,
        approximate=prog.approximate and exact is None,
    )
    merged = merge_windows(per_stream) if exact is not None else per_stream[0]
    return SoakReport(
        **head,
        max_model_len=max_len,
        soak_tokens=opts.tokens,
        concurrency=opts.concurrency,
        window=opts.window,
        collapse_fraction=opts.fraction,
        source="per-request" if exact is not None else "metrics",
        token_count_approximate=prog.approximate,
        text=text.source_part(),
        windows=[w.record() for w in merged],
        stream_windows=[[w.record() for w in ws] for ws in exact] if exact is not None else None,
        streams=streams,
        verdict=judged,
        server=watch.info(),
        server_queue=queue.result,
        decoding_at_once=at_once,
        checks=queued,
    )
