"""The report as console table sections: (title, headers, rows of strings); flagged figures read AUDIT (pure)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from qwenquant.bench.judge import audited

if TYPE_CHECKING:
    from qwenquant.bench.modes import RunReport
    from qwenquant.bench.runparts import CellReport, Range

Section = tuple[str, list[str], list[list[str]]]


def _fmt(s: Range | None, scale: float = 1.0, digits: int = 1) -> str:
    if not s:
        return "-"
    return f"{s.median * scale:.{digits}f} [{s.min * scale:.{digits}f}-{s.max * scale:.{digits}f}]"


def _flagged(report: RunReport) -> set[tuple[str, str]]:
    return audited(report.flags)


def _cell_rows(report: RunReport) -> list[list[str]]:
    audit = _flagged(report)
    rows = []
    for t in report.targets:
        for key, c in t.cells.items():
            if c.concurrency != 1:
                continue
            where = f"{t.label} {key}"

            def fig(name: str, scale: float = 1.0, digits: int = 1, where: str = where, c: CellReport = c) -> str:
                return "AUDIT" if (where, name) in audit else _fmt(getattr(c.figures, name), scale, digits)

            short = f" ({c.short_requests} short)" if c.short_requests else ""
            rows.append(
                [
                    t.label,
                    key.rsplit("/c", 1)[0],
                    fig("wall_tok_s"),
                    fig("decode_tok_s"),
                    fig("ttft_s", 1000.0, 0),
                    fig("prefill_tok_s", 1.0, 0),
                    f"{c.requests}{short}",
                ]
            )
    return rows


def _ladder_rows(report: RunReport) -> list[list[str]]:
    audit = _flagged(report)
    rows = []
    for t in report.targets:
        for step in t.ladder:
            where = f"{t.label} ladder c{step.concurrency}"
            # the ladder's c1 step is the c1 cell of its prompt: a figure flagged there is flagged here too
            cell = f"{t.label} {step.cell}"
            figs = [
                ("aggregate_tok_s", None),
                ("per_stream_wall_tok_s", "wall_tok_s"),
                ("per_stream_decode_tok_s", "decode_tok_s"),
            ]
            rows.append(
                [t.label, str(step.concurrency)]
                + [
                    "AUDIT"
                    if (where, k) in audit or (step.concurrency == 1 and (cell, same) in audit)
                    else _fmt(getattr(step, k))
                    for k, same in figs
                ]
            )
    return rows


def _acceptance_rows(report: RunReport) -> list[list[str]]:
    rows = []
    for t in report.targets:
        a = t.acceptance
        if not a.metrics_page:
            rows.append([t.label, "no /metrics", "-", "-"])
        elif not a.speculative:
            rows.append([t.label, "no drafts", "-", "-"])
        else:
            rows.append(
                [
                    t.label,
                    f"{a.mean_acceptance_length:.2f}",
                    f"{a.acceptance_rate:.2f}" if a.acceptance_rate is not None else "-",
                    " ".join(f"{p:.2f}" for p in a.per_position or []),
                ]
            )
    return rows


def _compare_rows(report: RunReport) -> list[list[str]]:
    """The ratios A/B; a ratio of a figure flagged on either side (or itself beyond the ratio line) reads AUDIT."""
    cmp = report.compare
    if cmp is None:
        return []
    audit = _flagged(report)
    sides = (cmp.a, cmp.b)
    rows = []
    for key, figs in cmp.cells.items():
        where = f"compare {key}"
        rows.append(
            [key]
            + [
                "AUDIT"
                if (where, f"{k} ratio") in audit or any((f"{s} {key}", k) in audit for s in sides)
                else _fmt(getattr(figs, k), 1.0, 2)
                for k in ("wall_tok_s", "decode_tok_s", "ttft_s", "prefill_tok_s")
            ]
        )
    for step in cmp.ladder:
        c = step.concurrency
        flagged = (f"compare ladder c{c}", "aggregate_tok_s ratio") in audit or any(
            (f"{s} ladder c{c}", "aggregate_tok_s") in audit for s in sides
        )
        rows.append([f"ladder c{c} aggregate", "AUDIT" if flagged else _fmt(step.aggregate_tok_s, 1.0, 2), "", "", ""])
    return rows


def sections(report: RunReport) -> list[Section]:
    """Tables: per-stream figures, ladder, acceptance, comparison, flags."""
    out: list[Section] = [
        (
            "one stream: median [min-max] over requests",
            ["config", "cell", "wall tok/s", "decode tok/s", "TTFT ms", "prefill tok/s", "requests"],
            _cell_rows(report),
        ),
        (
            "concurrency ladder",
            ["config", "streams", "aggregate tok/s", "per-stream wall tok/s", "per-stream decode tok/s"],
            _ladder_rows(report),
        ),
        (
            "speculative decoding (from /metrics deltas)",
            ["config", "mean acceptance length", "acceptance rate", "per position"],
            _acceptance_rows(report),
        ),
    ]
    if report.compare:
        c = report.compare
        out.append(
            (
                f"ratio {c.a} / {c.b}: median [min-max] over rounds",
                ["cell", "wall", "decode", "TTFT", "prefill"],
                _compare_rows(report),
            )
        )
    if report.flags:
        out.append(
            (
                "flags",
                ["kind", "where", "figure", "value", "line"],
                [[f.kind, f.where, f.figure, f"{f.value:.4g}", f"{f.line:.4g}"] for f in report.flags],
            )
        )
    return out
