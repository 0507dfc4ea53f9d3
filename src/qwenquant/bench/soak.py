"""`bench soak`'s arithmetic (pure): acceptance in windows of generated tokens, and the verdict.

Two sources of windows. Per request (vLLM's `--per-request-spec-decode-metrics detailed`: the usage
chunk's `metrics.speculative_decoding` lists every verify step's accepted and drafted counts): a step
that emits a+1 tokens belongs to the window its first token falls in, exact for every stream at any
concurrency. Otherwise /metrics counters scraped whenever the streamed tokens cross a window
boundary: exact for one stream, a blend of the streams (windows of their mean position) above that.

Verdict: `collapse` when a window's acceptance rate falls below `fraction` x the first window's, or it
accepts nothing where the first accepted some; `empty` / `truncated` responses (fewer tokens than
asked, ignore_eos being sent); `error`s; a `restart` of the server. A window shorter than a quarter
of the window size (the tail) is shown but not judged.
"""

from __future__ import annotations

from dataclasses import dataclass

from qwenquant.bench.parts import Flag, SoakFailure, SoakStream, SoakVerdict, WindowRecord

MIN_JUDGED_SHARE = 0.25


@dataclass(frozen=True)
class Window:
    index: int
    start: int  # generated tokens per stream at the window's start and end
    end: int
    drafts: float
    draft_tokens: float
    accepted: float
    per_pos: tuple[float, ...]  # accepted tokens at each draft position
    stream: int | None = None  # None: all streams together (/metrics)

    @property
    def rate(self) -> float | None:
        return self.accepted / self.draft_tokens if self.draft_tokens > 0 else None

    def record(self) -> WindowRecord:
        """The window as the report holds it."""
        d = self.drafts
        return WindowRecord(
            index=self.index,
            stream=self.stream,
            start=self.start,
            end=self.end,
            drafts=d,
            draft_tokens=self.draft_tokens,
            accepted=self.accepted,
            acceptance_rate=self.rate,
            mean_acceptance_length=1 + self.accepted / d if d > 0 else None,
            per_position=[p / d for p in self.per_pos] if d > 0 else None,
        )


@dataclass(frozen=True)
class Restart:
    """The server went away or restarted: the window it happened in (of the generated tokens), and why."""

    window: int
    why: str


def step_windows(
    accepted: list[int],
    drafted: list[int],
    window: int,
    stream: int | None = None,
    first: int = 1,
    total: int | None = None,
) -> list[Window]:
    """Windows of one stream's verify steps (per-request metrics): step i emits accepted[i] + 1 tokens,
    after the `first` token(s) the prefill emitted; the last window ends at `total` (the response's
    tokens: the last step's accepted drafts beyond max_tokens are counted by vLLM but not sent)."""
    k = max(drafted, default=0)
    out: list[Window] = []
    pos = first
    cur: _Filling | None = None
    for a, n in zip(accepted, drafted, strict=False):
        idx = pos // window
        if cur is None or cur.index != idx:
            if cur is not None:
                out.append(cur.close(pos, stream))
            cur = _Filling(idx, pos if cur is not None else 0, [0] * k)
        cur.drafts += 1 if n > 0 else 0
        cur.draft_tokens += n
        cur.accepted += a
        for i in range(min(a, k)):
            cur.pos[i] += 1
        pos += a + 1
    if cur is not None:
        out.append(cur.close(pos if total is None else min(pos, total), stream))
    return out


@dataclass
class _Filling:
    """The window the steps are filling: its index and first token, and what its steps drafted and accepted
    (per draft position too)."""

    index: int
    start: int
    pos: list[int]
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0

    def close(self, end: int, stream: int | None) -> Window:
        return Window(
            self.index, self.start, end, self.drafts, self.draft_tokens, self.accepted, tuple(self.pos), stream
        )


def merge_windows(per_stream: list[list[Window]]) -> list[Window]:
    """The streams' windows of the same index summed (for the chart and the /metrics-like view)."""
    by: dict[int, list[Window]] = {}
    for ws in per_stream:
        for w in ws:
            by.setdefault(w.index, []).append(w)
    out = []
    for idx in sorted(by):
        ws = by[idx]
        k = max(len(w.per_pos) for w in ws)
        pos = tuple(sum(w.per_pos[i] for w in ws if i < len(w.per_pos)) for i in range(k))
        out.append(
            Window(
                idx,
                min(w.start for w in ws),
                max(w.end for w in ws),
                sum(w.drafts for w in ws),
                sum(w.draft_tokens for w in ws),
                sum(w.accepted for w in ws),
                pos,
            )
        )
    return out


def collapse(windows: list[Window], fraction: float, window: int) -> tuple[Window, str] | None:
    """The first window whose acceptance collapsed against the first window's, and why."""
    if not windows or windows[0].rate is None:
        return None
    base = windows[0]
    for w in windows[1:]:
        if w.end - w.start < MIN_JUDGED_SHARE * window or w.draft_tokens < 0:
            continue  # a tail too short to judge; counters that went back (a restart, its own failure)
        rate = w.rate or 0.0
        if base.accepted > 0 and w.accepted == 0:
            return w, f"no accepted drafts (the first window accepted {base.rate:.2f} of its drafts)"
        if rate < fraction * (base.rate or 0.0):
            return w, f"acceptance {rate:.3f} is below {fraction:g} x the first window's {base.rate:.3f}"
    return None


def where(w: Window, approximate: bool = False) -> str:
    stream = f" of stream {w.stream}" if w.stream is not None else ""
    if approximate:
        return (
            f"window {w.index} (about generated tokens {w.start}-{w.end}{stream}: an approximate count, one token "
            f"per chunk with text, as the server sent no token ids)"
        )
    return f"window {w.index} (generated tokens {w.start}-{w.end}{stream})"


def _stream_failures(i: int, s: SoakStream, window: int, tokens: int) -> list[SoakFailure]:
    """A stream's error, emptiness or truncation, judged from the tokens it streamed where that count is
    exact (token ids), else from usage (the stream's own count is then a floor)."""
    exact = bool(s.streamed_exact)
    streamed = s.streamed_tokens or 0
    n = streamed if exact else (s.completion_tokens or 0)
    by = "streamed" if exact else "by usage"
    if s.error:
        return [
            SoakFailure(
                kind="error",
                window=streamed // window,
                stream=i,
                line=f"stream {i} failed in window {streamed // window} (after {'' if exact else 'at least '}"
                f"{streamed} streamed tokens): {s.error}",
            )
        ]
    if n == 0:
        return [
            SoakFailure(kind="empty", window=0, stream=i, line=f"stream {i} came back empty (window 0: 0 tokens {by})")
        ]
    if n < tokens:
        return [
            SoakFailure(
                kind="truncated",
                window=n // window,
                stream=i,
                line=f"stream {i} was truncated in window {n // window}: {n} of {tokens} tokens {by} "
                f"(finish reason {s.finish_reason})",
            )
        ]
    return []


def usage_flags(streams: list[SoakStream]) -> list[Flag]:
    """Streams whose usage disagrees with the tokens they streamed (exact counts only)."""
    out = []
    for i, s in enumerate(streams):
        usage, streamed = s.completion_tokens, s.streamed_tokens
        if s.streamed_exact and isinstance(usage, int) and usage != streamed and not s.error:
            out.append(
                Flag(
                    kind="cross-check",
                    check="usage-mismatch",
                    where=f"stream {i}",
                    figure="completion_tokens",
                    value=float(usage - (streamed or 0)),
                    line=0.0,
                    note=f"stream {i}: usage counts {usage} completion tokens, the stream carried {streamed} token ids",
                )
            )
    return out


def verdict(
    windows: list[list[Window]],
    streams: list[SoakStream],
    restart: Restart | None,
    fraction: float,
    window: int,
    tokens: int,
    approximate: bool = False,
) -> SoakVerdict:
    """`ok`, `failed` with each failure and the one line that names its window (the first failure's), or
    `not judged` when nothing failed but no window drafted a token (acceptance was not tested)."""
    fails: list[SoakFailure] = []
    for ws in windows:
        c = collapse(ws, fraction, window)
        if c:
            fails.append(
                SoakFailure(
                    kind="collapse",
                    window=c[0].index,
                    stream=c[0].stream,
                    line=f"MTP acceptance collapsed in {where(c[0], approximate)}: {c[1]}",
                )
            )
    for i, s in enumerate(streams):
        fails.extend(_stream_failures(i, s, window, tokens))
    if restart:
        fails.append(
            SoakFailure(
                kind="restart",
                window=restart.window,
                stream=None,
                line=f"the server went away or restarted in window {restart.window}: {restart.why}"
                + (" (an approximate count: one token per chunk with text)" if approximate else ""),
            )
        )
    fails.sort(key=lambda f: (f.window, f.kind != "restart"))
    drafted = any(w.drafts > 0 for ws in windows for w in ws)
    status = "failed" if fails else ("ok" if drafted else "not judged")
    line = fails[0].line if fails else None
    if not fails and not drafted:
        line = "acceptance not judged: the server drafted no tokens (is MTP on?); the streams were complete"
    return SoakVerdict(status=status, failures=fails, line=line, acceptance_judged=drafted, flags=usage_flags(streams))
