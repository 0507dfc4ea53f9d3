"""The report on the console: rich tables on stdout, where to find the JSON and PNG on stderr."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from qwenquant.bench.judge import audited
from qwenquant.bench.parts import Acceptance, GpuMemory, Range
from qwenquant.bench.table import sections
from qwenquant.console import console, stdout

if TYPE_CHECKING:
    from qwenquant.bench.modes import BenchReport, DepthReport, RunReport, SoakReport, TurnsReport
    from qwenquant.bench.parts import PrefixCache


def print_report(report: RunReport) -> None:
    """Print every table section, then the GPU sampling verdict and the output paths."""
    # a pipe or file gets whole tables, not ones folded to 80 columns
    out = stdout if stdout.is_terminal else Console(highlight=False, width=240)
    for title, headers, rows in sections(report):
        table = Table(title=Text(title), title_justify="left")
        for h in headers:
            table.add_column(
                Text(h), justify="left" if h in ("config", "cell", "kind", "where", "figure") else "right", no_wrap=True
            )
        for r in rows:
            table.add_row(*(Text(c) for c in r))  # plain text: "[min-max]" is not markup
        out.print(table)
    print_flags(report)
    gpu = report.gpu
    if gpu and gpu.sampled:
        sm = gpu.sm_mhz
        console.print(
            f"GPU {gpu.gpu_name}: SM clock {sm and sm.min}-{sm and sm.max} MHz, "
            f"throttled in {gpu.throttled_fraction or 0:.0%} of {gpu.samples} samples"
        )
    else:
        console.print(f"GPU: {gpu.why if gpu and gpu.why is not None else 'not sampled'}")
    console.print(f"json: {report.json_path}" + (f"  plot: {report.png_path}" if report.png_path else ""))


def print_flags(report: BenchReport, every: bool = False) -> None:
    """One line per cross-check flag (a disagreement is never silent); figures beyond a line read AUDIT in the
    tables, and get a line of their own too where a mode prints them outside one (`every`)."""
    for f in report.flags:
        if every or f.kind == "cross-check":
            console.print(f.text(), markup=False, highlight=False)


def _fig(report: BenchReport, where: str, figure: str, value: Any, fmt: str) -> str:
    """A figure as a table shows it: AUDIT where it is flagged too good (judge.py), else the number."""
    return "AUDIT" if (where, figure) in audited(report.flags) else _num(value, fmt)


def _num(v: Any, fmt: str) -> str:
    return format(v, fmt) if isinstance(v, int | float) else "-"


def _acc(a: Acceptance) -> str:
    if not a.metrics_page:
        return "no /metrics"
    return " ".join(f"{p:.2f}" for p in a.per_position or []) if a.speculative else "no drafts"


def _mem(m: GpuMemory) -> str:
    return f"{m.peak_used_mib:.0f}" if m.sampled else "not sampled"


def depth_rows(report: DepthReport) -> list[list[str]]:
    """One row per rung (pure)."""
    rows = []
    for r in report.rungs:
        status = "ok" if r.ok else "FAILED"
        where = f"depth {r.depth}"
        rows.append(
            [
                str(r.depth),
                _num(r.prompt_tokens, "d"),
                _fig(report, where, "ttft_s", r.ttft_s, ".2f"),
                _fig(report, where, "prefill_tok_s", r.prefill_tok_s, ".0f"),
                _fig(report, where, "wall_tok_s", r.wall_tok_s, ".1f"),
                _fig(report, where, "decode_tok_s", r.decode_tok_s, ".1f"),
                _acc(r.acceptance),
                _mem(r.gpu_memory),
                status,
            ]
        )
    return rows


def _spread(sp: Range | None, fmt: str) -> str:
    return "/".join(format(v, fmt) for v in (sp.min, sp.median, sp.max)) if sp else "-"


def burst_rows(report: DepthReport) -> list[list[str]]:
    """One row per burst rung: TTFT over its requests, the aggregate prefill, median rates (pure)."""
    rows = []
    for r in report.rungs:
        failed = "?" if r.failed is None else r.failed
        status = "ok" if r.ok else f"FAILED ({failed} of {'?' if r.concurrency is None else r.concurrency})"
        where = f"depth {r.depth}"
        ttft = "AUDIT" if (where, "ttft_s") in audited(report.flags) else _spread(r.ttft, ".2f")
        rows.append(
            [
                str(r.depth),
                _num(r.prompt_tokens, "d"),
                ttft,
                _fig(report, where, "prefill_tok_s", r.prefill_tok_s, ".0f"),
                _fig(report, where, "wall_tok_s", r.wall_tok_s, ".1f"),
                _fig(report, where, "decode_tok_s", r.decode_tok_s, ".1f"),
                _acc(r.acceptance),
                _mem(r.gpu_memory),
                status,
            ]
        )
    return rows


def turns_rows(report: TurnsReport) -> list[list[str]]:
    """One row per turn of the conversation (pure)."""
    rows = []
    for r in report.turns:
        pc = r.prefix_cache
        where = f"turn {r.turn}"
        rows.append(
            [
                str(r.turn),
                _num(r.depth, "d"),
                _num(r.new_tokens, "d"),
                _fig(report, where, "ttft_s", r.ttft_s, ".2f"),
                _fig(report, where, "new_prefill_tok_s", r.new_prefill_tok_s, ".0f"),
                f"{pc.hits:.0f}/{pc.queries:.0f}" if pc else "no counters",
                _fig(report, where, "decode_tok_s", r.decode_tok_s, ".1f"),
                _acc(r.acceptance),
                _mem(r.gpu_memory),
                "ok" if r.ok else "FAILED",
            ]
        )
    return rows


def cache_line(pc: PrefixCache) -> str:
    """Whether the server cached prefixes, as its counters say (pure)."""
    if not pc.counters:
        return "prefix cache: unknown (no vllm:prefix_cache_* counters on /metrics)"
    if pc.cached is None:
        return "prefix cache: unknown (one turn only)"
    if not pc.queries:
        return "prefix cache: off (the server looked up no tokens after turn 0): each turn prefilled its whole context"
    if pc.cached:
        return f"prefix cache: the server cached ({pc.hits:.0f} of {pc.queries:.0f} queried tokens hit after turn 0)"
    return (
        f"prefix cache: NO hits after turn 0 ({pc.queries:.0f} tokens queried): each turn prefilled its whole context"
    )


def print_turns(report: TurnsReport) -> None:
    """The conversation's table on stdout, the cache verdict and the output path on stderr."""
    _print_table(
        f"conversation ({report.turn_tokens}-token user turns, {report.output_tokens}-token answers)",
        [
            "turn",
            "context tokens",
            "new tokens",
            "TTFT s",
            "new-token prefill tok/s",
            "prefix-cache hits/queries",
            "decode tok/s",
            "acceptance per position",
            "GPU peak MiB",
            "status",
        ],
        turns_rows(report),
    )
    console.print(cache_line(report.prefix_cache))
    print_flags(report, every=True)
    fail = report.failure
    console.print(
        f"deepest context that worked: {report.last_ok_depth} tokens"
        + (f"; failed at turn {fail.turn} ({fail.depth} tokens): {fail.reason}" if fail else "")
    )
    console.print(f"json: {report.json_path}")


def _print_table(title: str, headers: list[str], rows: list[list[str]]) -> None:
    out = stdout if stdout.is_terminal else Console(highlight=False, width=240)
    table = Table(title=Text(title), title_justify="left")
    for h in headers:
        table.add_column(Text(h), justify="right", no_wrap=True)
    for r in rows:
        table.add_row(*(Text(c) for c in r))
    out.print(table)


def print_depth(report: DepthReport) -> None:
    """The ladder's table on stdout, its verdict and the output paths on stderr."""
    n = report.concurrency
    if n > 1:
        _print_table(
            f"burst ladder ({n} fresh prompts at once per rung)",
            [
                "depth",
                "prompt tokens",
                "TTFT s min/median/max",
                "prefill tok/s (all)",
                "wall tok/s",
                "decode tok/s",
                "acceptance per position",
                "GPU peak MiB",
                "status",
            ],
            burst_rows(report),
        )
    else:
        _print_table(
            "depth ladder (one fresh prompt per rung)",
            [
                "depth",
                "prompt tokens",
                "TTFT s",
                "prefill tok/s",
                "wall tok/s",
                "decode tok/s",
                "acceptance per position",
                "GPU peak MiB",
                "status",
            ],
            depth_rows(report),
        )
    print_flags(report, every=True)
    fail = report.failure
    console.print(
        f"deepest prompt that worked: {report.last_ok_depth} tokens"
        + (f"; failed at {fail.depth}: {fail.reason}" if fail else "")
    )
    console.print(f"json: {report.json_path}" + (f"  plot: {report.png_path}" if report.png_path else ""))


def soak_rows(report: SoakReport) -> list[list[str]]:
    """One row per window (all streams together) (pure)."""
    return [
        [
            str(w.index),
            f"{w.start}-{w.end}",
            _num(w.drafts, ".0f"),
            _num(w.acceptance_rate, ".3f"),
            _num(w.mean_acceptance_length, ".2f"),
            " ".join(f"{p:.2f}" for p in w.per_position) if w.per_position else "no drafts",
        ]
        for w in report.windows
    ]


def print_soak(report: SoakReport) -> None:
    """The windows' table on stdout, the streams and the verdict on stderr."""
    _print_table(
        f"soak: MTP acceptance per {report.window}-token window ({report.source})",
        ["window", "generated tokens", "drafts", "acceptance rate", "mean acceptance length", "per position"],
        soak_rows(report),
    )
    for i, s in enumerate(report.streams):
        decode = _fig(report, f"stream {i}", "decode_tok_s", s.decode_tok_s, ".1f")
        usage = s.completion_tokens if "completion_tokens" in s.model_fields_set else 0
        console.print(
            f"stream {i}: {usage} tokens by usage, {s.streamed_tokens} "
            f"streamed{'' if s.streamed_exact else ' (at least)'}, finish {s.finish_reason}, "
            f"decode {decode} tok/s" + (f", error: {s.error}" if s.error else "")
        )
    print_flags(report, every=True)
    v = report.verdict
    console.print(f"verdict: {v.status}" + (f": {v.line}" if v.line else ""), markup=False, highlight=False)
    console.print(f"json: {report.json_path}" + (f"  plot: {report.png_path}" if report.png_path else ""))
