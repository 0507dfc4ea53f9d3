"""The typed parts of a bench report (pydantic, frozen, strict: an int stays an int, a float a float): a
flag, the shipped text, the server's health, a long run's failure, the prefix cache's and the soak's
verdicts. A part's JSON holds exactly the keys it was built or read with (`to_json`), so a report
read back and written again is the same bytes (the base, `Part`, and `plain` are qwenquant.reportpart's)."""

from __future__ import annotations

from qwenquant.reportpart import Part

Number = int | float  # as measured: never coerced (a count stays an int, a rate a float)


class Range(Part):
    """A figure's median and range (min, max) over `n` values (rates.Spread); a burst's TTFT and decode
    spreads and the GPU's clocks and power give no `n`."""

    median: Number
    min: Number
    max: Number
    n: int | None = None


class Flag(Part):
    """A figure beyond its line: a cross-check's disagreement (`check` names it; `requests`: how many
    requests of a merged group had it), a too-good figure (AUDIT), a short stream, a throttle."""

    kind: str
    where: str
    figure: str
    value: Number | str | None
    line: Number | str | None
    note: str
    check: str | None = None
    requests: int | None = None

    def text(self) -> str:
        """The one line the flag prints (a cross-check's note, or a figure beyond its line)."""
        if self.kind == "cross-check":
            return f"flag {self.check}: {self.note}"
        value = f"{self.value:.4g}" if isinstance(self.value, int | float) else str(self.value)
        line = f"{self.line:.4g}" if isinstance(self.line, int | float) else str(self.line)
        return f"flag {self.kind}: {self.where} {self.figure} {value} beyond the line {line}"


class TextSource(Part):
    """The shipped text the prompts are cut from: its sha256, license and source."""

    sha256: str
    license: str
    source: str


class ServerHealth(Part):
    """The server's process start time (a restart moves it) and whether qwenquant supervised it."""

    process_start_time: Number | None
    supervised: bool


class RunFailure(Part):
    """The request that ended a run or compare: its target, cell and round, how many of the wave failed."""

    target: str
    cell: str
    round: int
    failed: int
    of: int
    reason: str


class QueueCounts(Part):
    """The server's queue while streams meant to run at once ran: the most running and the most waiting
    requests on one /metrics page (vLLM's gauges, floats), over `pages` pages."""

    max_running: Number
    max_waiting: Number
    pages: int


class Failure(Part):
    """What ended a depth ladder (its rung's depth) or a conversation (its turn and depth), and why."""

    depth: int
    reason: str
    turn: int | None = None


class PrefixCache(Part):
    """Whether the server cached over the turns after the first (None: no counters to say)."""

    counters: bool
    cached: bool | None = None
    hits: Number | None = None  # tokens, as /metrics counts them (floats)
    queries: Number | None = None


class WindowRecord(Part):
    """One soak window of generated tokens (`stream` None: all streams together, from /metrics): its drafts,
    draft tokens and accepted tokens, and what they make (None where nothing was drafted)."""

    index: int
    stream: int | None
    start: int
    end: int
    drafts: Number
    draft_tokens: Number
    accepted: Number
    acceptance_rate: Number | None
    mean_acceptance_length: Number | None
    per_position: list[Number] | None


class SoakFailure(Part):
    """One failure of a soak: a collapse, an error, an empty or truncated stream, a restart; its window."""

    kind: str
    window: int
    stream: int | None
    line: str


class SoakVerdict(Part):
    """`ok`, `failed` (each failure; `line`: the first's) or `not judged` (no window drafted a token)."""

    status: str
    failures: list[SoakFailure]
    line: str | None
    acceptance_judged: bool
    flags: list[Flag]


class Acceptance(Part):
    """MTP acceptance over a request (metrics.acceptance: /metrics deltas around it): no page
    (`metrics_page` false, `speculative` None), nothing drafted (`speculative` false; `counters`: whether the
    server exports the counters at all), else the drafts, draft and accepted tokens (floats, as /metrics
    counts them), the mean acceptance length, the rate and the rate per draft position."""

    metrics_page: bool
    speculative: bool | None
    counters: bool | None = None
    drafts: Number | None = None
    draft_tokens: Number | None = None
    accepted: Number | None = None
    mean_acceptance_length: Number | None = None
    acceptance_rate: Number | None = None
    per_position: list[Number] | None = None


class GpuPeak(Part):
    """One GPU's memory over a request: the most used, the total and the least free MiB (nvidia-smi's own
    free column), over `samples` samples."""

    peak_used_mib: Number
    total_mib: Number
    min_free_mib: Number
    samples: int


class GpuMemory(Part):
    """The GPU memory peak over a request (gpu.MemoryPeak): not sampled and why, or nvidia-smi's interval,
    per GPU the most used, total and least free MiB and the samples, and the most used of any GPU."""

    sampled: bool
    why: str | None = None
    interval_ms: int | None = None
    gpus: dict[str, GpuPeak] | None = None
    peak_used_mib: Number | None = None


class RequestRecord(Part):
    """One streamed request's record (rung.request_record): its four figures (rates.py, None where
    undefined), its counts (usage's and the stream's own: token ids where they came back, else events with
    text) and its cross-check flags. Every key is absent where the request came to nothing (a failed rung)."""

    wall_tok_s: Number | None = None
    decode_tok_s: Number | None = None
    ttft_s: Number | None = None
    prefill_tok_s: Number | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    text_events: int | None = None
    streamed_tokens: int | None = None
    streamed_exact: bool | None = None
    reasoning_tokens: int | None = None
    checks: list[Flag] = []


class BurstRequest(RequestRecord):
    """One request of a burst rung: its record (absent where it failed) and why it failed (None: it worked)."""

    failure: str | None


class DepthRung(RequestRecord):
    """One rung of the depth ladder: its depth, the request's record (a burst's: its requests' medians, the
    slowest TTFT and the aggregate prefill), the seconds it took, the GPU memory peak, MTP acceptance around it
    and whether it worked. One request: the prompt's characters and /tokenize count, the characters streamed.
    A burst: its concurrency, one /tokenize count per request, the server's queue, the most requests seen
    decoding at once, the queue's checks (`checks`), each request, the spreads of TTFT and decode (min, median,
    max) and how many failed."""

    depth: int
    seconds: Number
    gpu_memory: GpuMemory
    acceptance: Acceptance
    ok: bool
    prompt_chars: int | None = None
    tokenize_count: int | list[int | None] | None = None
    streamed_chars: int | None = None
    concurrency: int | None = None
    server_queue: QueueCounts | None = None
    decoding_at_once: int | None = None
    requests: list[BurstRequest] | None = None
    ttft: Range | None = None
    decode: Range | None = None
    failed: int | None = None


class CacheDelta(Part):
    """The prefix cache's counters' change over a turn (tokens, as /metrics counts them: floats)."""

    queries: Number
    hits: Number


class TurnRecord(RequestRecord):
    """One turn of a conversation: its depth (the server's count where it answered, else the fitted one), its
    messages, the request's record, the seconds it took, the tokens new since the last turn and their prefill
    rate, the prefix cache's counters over it (None: /metrics lacks them), MTP acceptance, the GPU memory peak
    and whether it worked."""

    turn: int
    depth: int
    messages: int
    gpu_memory: GpuMemory
    prefix_cache: CacheDelta | None
    acceptance: Acceptance
    seconds: Number
    new_tokens: int | None
    new_prefill_tok_s: Number | None
    ok: bool


class SoakStream(RequestRecord):
    """One stream of a soak: its error (None: it worked), the request's record where it came back, and the
    tokens it streamed as the soak counted them (`streamed_exact`: token ids, else a floor of one per chunk
    with text)."""

    error: str | None
