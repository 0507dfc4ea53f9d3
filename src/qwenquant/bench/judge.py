"""How every bench mode judges what it measured (pure): the same functions for run and compare, the depth
ladder and its bursts, the soak and the conversation.

- too-good: a figure beyond the bench config's line (a rate above it, a TTFT below its floor) is flagged
  for audit; every table then shows AUDIT in its place, never the raw figure.
- short-stream: a stream that ended with fewer completion tokens than it asked for (ignore_eos sent): its
  rates cover fewer tokens than the run says it measured.
- queued: streams meant to run at once that the server ran one after another (queued.py).

Each finding is a flag (parts.Flag: kind, where, figure, value, line, note); a cross-check's kind is
"cross-check" with its check named, as checks.py writes them.
"""

from __future__ import annotations

from typing import Any

from qwenquant.bench.parts import Flag, Number
from qwenquant.bench.workload import BenchConfig

RATE_FIGURES = ("wall_tok_s", "decode_tok_s", "prefill_tok_s")
AUDIT_NOTE = "flagged for audit, not reported"


def too_good(where: str, figure: str, value: Any, line: float, above: bool = True) -> Flag | None:
    """The too-good flag of one figure: above its line (a rate), or below it (`above` False: a TTFT floor)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    if (value > line) if above else (value < line):
        return Flag(kind="too-good", where=where, figure=figure, value=value, line=line, note=AUDIT_NOTE)
    return None


def too_good_flags(
    where: str, figures: dict[str, Number | None], cfg: BenchConfig, lines: dict[str, str] | None = None
) -> list[Flag]:
    """The too-good flags of one request, rung, turn or stream: each rate against its line, TTFT against the
    floor. `lines` names the line of a figure named otherwise (a turn's `new_prefill_tok_s`: prefill's)."""
    lines = lines or {}
    out = []
    for figure, value in figures.items():
        kind = lines.get(figure, figure)
        if kind == "ttft_s":
            f = too_good(where, figure, value, cfg.ttft_floor_s, above=False)
        elif kind in RATE_FIGURES:
            f = too_good(where, figure, value, getattr(cfg.too_good, kind))
        else:
            continue
        if f:
            out.append(f)
    return out


def short_stream(where: str, got: Any, asked: Any, finish_reason: Any = None, requests: int = 1) -> Flag | None:
    """The flag of a stream (or `requests` streams) that ended before the tokens it asked for, or None."""
    if not isinstance(got, int) or not isinstance(asked, int) or got >= asked:
        return None
    many = f"{requests} streams ended short, the first" if requests > 1 else "the stream"
    return Flag(
        kind="cross-check",
        check="short-stream",
        where=where,
        figure="completion_tokens",
        value=float(got),
        line=float(asked),
        note=f"{where}: {many} ended after {got} of the {asked} tokens asked (finish reason {finish_reason}, "
        f"ignore_eos sent): its rates cover fewer tokens than asked",
    )


def audited(flags: list[Flag]) -> set[tuple[str, str]]:
    """(where, figure) of every too-good flag: the figures every table shows as AUDIT."""
    return {(f.where, f.figure) for f in flags if f.kind == "too-good"}
