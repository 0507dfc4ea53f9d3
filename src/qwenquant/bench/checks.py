"""Every request's figures checked against an independent count (pure): what usage says against what
the stream carried, and the wall rate against the phase decode rate, whatever the thinking setting.

- unstreamed reasoning: usage counts reasoning tokens (vLLM's `completion_tokens_details`) and no
  reasoning was streamed, or usage counts more tokens than the token ids streamed: the decode rate
  over the phase after the first text then divides tokens generated before it by the time after it
  (the 1.6-2x inflation of a thinking run whose reasoning is counted but hidden).
- usage mismatch: usage and the streamed token ids disagree (exact), or the stream carried more
  events with text than usage counts tokens (usage under-counts; without ids the events are a floor).
- wall vs decode: without token ids there is no exact count, so the two rates are compared: they
  differ only by the TTFT share, and a larger gap is a prefill that long or a phase the stream hid.

Each finding is a flag (parts.Flag: kind "cross-check", its check, where, figure, value, line, note), its
note the one line a user reads.
"""

from __future__ import annotations

import statistics

from qwenquant.bench.parts import Flag
from qwenquant.bench.rates import sample_figures, wall_decode_gap
from qwenquant.bench.stream import Sample

WALL_DECODE_MARGIN = 0.10


def _flag(check: str, where: str, figure: str, value: float, line: float, note: str) -> Flag:
    return Flag(
        kind="cross-check", check=check, where=where, figure=figure, value=value, line=line, note=f"{where}: {note}"
    )


def _hidden(s: Sample) -> int | None:
    """Tokens usage counts that the stream did not carry, where that is known exactly."""
    if s.reasoning_tokens and not s.reasoning_streamed:
        return s.reasoning_tokens
    if s.exact and s.completion_tokens > s.streamed_tokens:
        return s.completion_tokens - s.streamed_tokens
    return None


def request_checks(s: Sample, where: str, margin: float | None = WALL_DECODE_MARGIN) -> list[Flag]:
    """The cross-check flags of one request (empty when every count agrees); `margin` None leaves the
    wall-vs-decode comparison to the caller (a cell compares its medians: cell_checks)."""
    out: list[Flag] = []
    n, streamed = s.completion_tokens, s.streamed_tokens
    hidden = _hidden(s)
    figs = sample_figures(s)
    if hidden:
        shown = n - hidden
        true = (
            (shown - 1) / (s.t_end - s.t_first) if s.t_first is not None and shown > 1 and s.t_end > s.t_first else None
        )
        what = "reasoning tokens" if s.reasoning_tokens and not s.reasoning_streamed else "tokens"
        out.append(
            _flag(
                "unstreamed-reasoning",
                where,
                "decode_tok_s",
                hidden / max(1, n),
                0.0,
                f"{hidden} of {n} {what} were counted in usage but not streamed (reasoning hidden by the "
                f"server?): decode {_num(figs['decode_tok_s'])} tok/s over the streamed phase is inflated; "
                f"over the tokens streamed it is {_num(true)} tok/s",
            )
        )
    if s.exact and streamed > n:
        out.append(
            _flag(
                "usage-mismatch",
                where,
                "completion_tokens",
                float(streamed - n),
                0.0,
                f"the stream carried {streamed} token ids but usage counts {n} completion tokens",
            )
        )
    elif not s.exact and streamed > n:
        out.append(
            _flag(
                "usage-mismatch",
                where,
                "completion_tokens",
                float(streamed - n),
                0.0,
                f"the stream carried at least {streamed} tokens (events with text) but usage counts {n}",
            )
        )
    if margin is not None and not s.exact and hidden is None:
        out += _wall_decode(figs["wall_tok_s"], figs["decode_tok_s"], figs["ttft_s"], where, margin)
    return out


def _wall_decode(wall: float | None, decode: float | None, ttft: float | None, where: str, margin: float) -> list[Flag]:
    gap = wall_decode_gap(wall, decode)
    if gap is None or gap <= margin:
        return []
    return [
        _flag(
            "wall-vs-decode",
            where,
            "wall vs decode",
            gap,
            margin,
            f"wall {_num(wall)} and decode {_num(decode)} tok/s differ by {gap:.0%} (TTFT {_num(ttft, '.3f')} "
            f"s): a prefill that long, or a phase counted in usage but not streamed (reasoning hidden by the "
            f"server?) that inflates decode; no token ids came back to tell",
        )
    ]


def cell_checks(samples: list[Sample], where: str, margin: float = WALL_DECODE_MARGIN) -> list[Flag]:
    """A cell's flags: each request's count checks, and wall against decode over the cell's medians (one slow
    request's TTFT is not an instrument problem) where no request counted its tokens exactly."""
    out = merge_checks([f for s in samples for f in request_checks(s, where, None)])
    if samples and not any(s.exact for s in samples) and not any(f.check == "unstreamed-reasoning" for f in out):
        figs = [sample_figures(s) for s in samples]

        def med(k: str) -> float | None:
            v = sorted(x for f in figs if (x := f[k]) is not None)
            return statistics.median(v) if v else None

        out += _wall_decode(med("wall_tok_s"), med("decode_tok_s"), med("ttft_s"), where, margin)
    return out


def merge_checks(flags: list[Flag]) -> list[Flag]:
    """One flag per (check, where): the first request's note, with how many requests of the group had it."""
    by: dict[tuple[str | None, str], list[Flag]] = {}
    for f in flags:
        by.setdefault((f.check, f.where), []).append(f)
    out = []
    for group in by.values():
        f = group[0]
        if len(group) > 1:
            f = Flag(**{**f.given(), "note": f"{f.note} ({len(group)} requests)", "requests": len(group)})
        out.append(f)
    return out


def _num(v: float | None, fmt: str = ".1f") -> str:
    return format(v, fmt) if isinstance(v, int | float) else "-"
