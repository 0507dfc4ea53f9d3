"""The PNGs of `bench depth` (rates and acceptance against depth) and `bench soak` (acceptance
against generated tokens), from their reports (the series are pure)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from qwenquant.bench.chart import Panel, Series, write_chart

if TYPE_CHECKING:
    from qwenquant.bench.modes import DepthReport, SoakReport


def _positions(points: list[tuple[float, list[float]]]) -> list[Series]:
    n = max((len(p) for _, p in points), default=0)
    return [(f"position {i}", [(x, p[i]) for x, p in points if len(p) > i]) for i in range(n)]


def depth_series(report: DepthReport) -> list[Panel]:
    """Prefill rate; decode and wall rates; acceptance per draft position: each against the server's depth (a
    rate flagged too good is left out, as the table shows AUDIT in its place)."""
    from qwenquant.bench.judge import audited

    ok = [(r, r.prompt_tokens) for r in report.rungs if r.prompt_tokens]
    audit = audited(report.flags)

    def pts(key: str) -> list[tuple[float, float]]:
        return [
            (float(n), v)
            for r, n in ok
            if (v := getattr(r, key)) is not None and (f"depth {r.depth}", key) not in audit
        ]

    acc = [(float(n), r.acceptance.per_position or []) for r, n in ok]
    return [
        Panel("prefill tokens / s", [("prefill", pts("prefill_tok_s"))]),
        Panel("tokens / s", [("decode", pts("decode_tok_s")), ("wall", pts("wall_tok_s"))]),
        Panel("acceptance per draft position", _positions(acc), ymax=1.0),
    ]


def depth_png(report: DepthReport, path: Path) -> None:
    fail = report.failure
    title = "qwenquant bench depth: rates and MTP acceptance against prompt depth" + (
        f" (failed at {fail.depth})" if fail else ""
    )
    write_chart(path, title, "prompt tokens (counted by the server)", depth_series(report), log2x=True)


def soak_series(report: SoakReport) -> list[Panel]:
    """Acceptance per draft position and the mean acceptance length, per window of generated tokens."""
    acc = [(float(w.end), w.per_position) for w in report.windows if w.per_position is not None]
    mal = [(float(w.end), w.mean_acceptance_length) for w in report.windows if w.mean_acceptance_length]
    return [
        Panel("acceptance per draft position", _positions(acc), ymax=1.0),
        Panel("mean acceptance length", [("tokens per step", mal)]),
    ]


def soak_png(report: SoakReport, path: Path) -> None:
    title = f"qwenquant bench soak: MTP acceptance per {report.window}-token window ({report.verdict.status})"
    write_chart(path, title, "generated tokens per stream", soak_series(report))
