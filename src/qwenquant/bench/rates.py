"""The figures, from timed samples (pure): both rate denominators, TTFT, prefill, spreads, ratios.

- wall rate   = server-counted completion tokens / (t_end - t_sent)
- decode rate = (completion tokens - 1) / (t_end - t_first): the first token belongs to the prefill
- TTFT        = t_first - t_sent;  prefill rate = prompt tokens / TTFT
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from qwenquant.bench.stream import Sample

FIGURES = ("wall_tok_s", "decode_tok_s", "ttft_s", "prefill_tok_s")


def sample_figures(s: Sample) -> dict[str, float | None]:
    """The four per-request figures; None where undefined (no text streamed, one token only)."""
    total = s.t_end - s.t_sent
    out: dict[str, float | None] = {
        "wall_tok_s": s.completion_tokens / total if total > 0 else None,
        "decode_tok_s": None,
        "ttft_s": None,
        "prefill_tok_s": None,
    }
    if s.t_first is not None:
        ttft = s.t_first - s.t_sent
        after = s.t_end - s.t_first
        out["ttft_s"] = ttft
        out["prefill_tok_s"] = s.prompt_tokens / ttft if ttft > 0 else None
        if s.completion_tokens > 1 and after > 0:
            out["decode_tok_s"] = (s.completion_tokens - 1) / after
    return out


@dataclass(frozen=True)
class Spread:
    """Median with min and max over n values."""

    median: float
    lo: float
    hi: float
    n: int

    def as_dict(self) -> dict[str, float]:
        return {"median": self.median, "min": self.lo, "max": self.hi, "n": self.n}


def spread(values: Iterable[float | None]) -> Spread | None:
    v = [x for x in values if x is not None]
    if not v:
        return None
    return Spread(statistics.median(v), min(v), max(v), len(v))


def cell_figures(samples: Sequence[Sample]) -> dict[str, Spread | None]:
    """Median and range of each figure over the samples of one cell."""
    per = [sample_figures(s) for s in samples]
    return {k: spread(p[k] for p in per) for k in FIGURES}


def wave_aggregate(samples: Sequence[Sample]) -> float | None:
    """Aggregate rate of requests run at once: all completion tokens / first send to last end."""
    if not samples:
        return None
    span = max(s.t_end for s in samples) - min(s.t_sent for s in samples)
    return sum(s.completion_tokens for s in samples) / span if span > 0 else None


def ratio_spread(a_rounds: Sequence[float | None], b_rounds: Sequence[float | None]) -> Spread | None:
    """Per-round ratios A/B (rounds paired in order), as median and range."""
    return spread(a / b for a, b in zip(a_rounds, b_rounds, strict=False) if a is not None and b not in (None, 0))


def wall_decode_gap(wall: float | None, decode: float | None) -> float | None:
    """|wall - decode| / decode: in a non-thinking run only the TTFT share should separate them."""
    if wall is None or not decode:
        return None
    return abs(wall - decode) / decode
