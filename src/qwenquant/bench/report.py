"""The run as its typed report (modes.RunReport, its tree runparts'): per target its cells and ladder, the
comparison, and the flags the figures raise (pure)."""

from __future__ import annotations

import statistics

from qwenquant.bench import metrics
from qwenquant.bench.checks import cell_checks, merge_checks
from qwenquant.bench.judge import short_stream, too_good, too_good_flags
from qwenquant.bench.modes import RunReport
from qwenquant.bench.parts import Acceptance, Flag, Number, Range
from qwenquant.bench.rates import (
    FIGURES,
    Spread,
    cell_figures,
    ratio_spread,
    sample_figures,
    spread,
    wave_aggregate,
)
from qwenquant.bench.runner import TargetRun, target_info
from qwenquant.bench.runparts import (
    CellReport,
    CompareRung,
    Comparison,
    Figures,
    GpuClocks,
    LadderRung,
    RequestFigures,
    RoundMedians,
    RunConfig,
    RunOptions,
    RunTarget,
)
from qwenquant.bench.stream import Sample
from qwenquant.bench.workload import BenchConfig, Cell


def _median(v: list[float | None]) -> float | None:
    v2 = [x for x in v if x is not None]
    return statistics.median(v2) if v2 else None


def _round_medians(rounds: list[list[Sample]]) -> RoundMedians:
    per = [[sample_figures(s) for s in r] for r in rounds]
    return RoundMedians(**{k: [_median([p[k] for p in r]) for r in per] for k in FIGURES})


def _range(s: Spread | None) -> Range | None:
    return Range(median=s.median, min=s.lo, max=s.hi, n=s.n) if s else None


def _request(s: Sample) -> RequestFigures:
    return RequestFigures(
        **sample_figures(s),
        prompt_tokens=s.prompt_tokens,
        completion_tokens=s.completion_tokens,
        first_field=s.first_field,
        finish_reason=s.finish_reason,
        text_events=s.text_events,
        streamed_tokens=s.streamed_tokens,
        streamed_exact=s.exact,
        reasoning_tokens=s.reasoning_tokens,
    )


def _cell_report(cell: Cell, rounds: list[list[Sample]], where: str, margin: float) -> CellReport:
    flat = [s for r in rounds for s in r]
    figs = cell_figures(flat)
    fields: dict[str, int] = {}
    for s in flat:
        if s.first_field:
            fields[s.first_field] = fields.get(s.first_field, 0) + 1
    return CellReport(
        prompt=cell.prompt,
        sampling=cell.sampling,
        thinking=cell.thinking,
        concurrency=cell.concurrency,
        figures=Figures(**{k: _range(v) for k, v in figs.items()}),
        round_medians=_round_medians(rounds),
        requests=len(flat),
        short_requests=sum(s.short for s in flat),
        max_tokens=flat[0].max_tokens if flat else None,
        prompt_tokens=_median([float(s.prompt_tokens) for s in flat]),
        completion_tokens=sum(s.completion_tokens for s in flat),
        first_text_field=fields,
        reasoning_streamed=any(s.reasoning_streamed for s in flat),
        per_request=[_request(s) for s in flat],
        checks=cell_checks(flat, where, margin),
    )


def _ladder_report(run: TargetRun) -> list[LadderRung]:
    out = []
    for cell in run.ladder:
        rounds = run.waves.get(cell.key, [])
        waves = [w for r in rounds for w in r]
        flat = [s for w in waves for s in w]
        per = [sample_figures(s) for s in flat]
        out.append(
            LadderRung(
                concurrency=cell.concurrency,
                cell=cell.key,
                aggregate_tok_s=_range(spread(wave_aggregate(w) for w in waves)),
                checks=merge_checks(run.queued.get(cell.key, [])),
                aggregate_round_medians=[_median([wave_aggregate(w) for w in r]) for r in rounds],
                per_stream_wall_tok_s=_range(spread(p["wall_tok_s"] for p in per)),
                per_stream_decode_tok_s=_range(spread(p["decode_tok_s"] for p in per)),
            )
        )
    return out


def target_report(run: TargetRun, margin: float) -> RunTarget:
    t = run.target
    acc = metrics.acceptance(run.spec) if run.metrics_exported else Acceptance(metrics_page=False, speculative=None)
    return RunTarget(
        **target_info(t).given(),
        thinking=run.thinking_note,
        acceptance=acc,
        cells={c.key: _cell_report(c, run.samples.get(c.key, []), f"{t.label} {c.key}", margin) for c in run.cells},
        ladder=_ladder_report(run),
    )


def compare_report(a: RunTarget, b: RunTarget) -> Comparison:
    """Per cell and figure: the per-round ratio A/B as median and range (rounds paired in order)."""
    cells = {}
    for key, ca in a.cells.items():
        if key not in b.cells:
            continue
        ra, rb = ca.round_medians, b.cells[key].round_medians
        cells[key] = Figures(**{k: _range(ratio_spread(getattr(ra, k), getattr(rb, k))) for k in FIGURES})
    ladder = [
        CompareRung(
            concurrency=la.concurrency,
            aggregate_tok_s=_range(ratio_spread(la.aggregate_round_medians, lb.aggregate_round_medians)),
        )
        for la, lb in zip(a.ladder, b.ladder, strict=False)
        if la.concurrency == lb.concurrency
    ]
    return Comparison(a=a.label, b=b.label, ratio="A/B", cells=cells, ladder=ladder)


def _cell_flags(where: str, c: CellReport, cfg: BenchConfig, ignore_eos: bool) -> list[Flag]:
    """A cell's too-good figures (their medians), its cross-checks, and its streams that ended before
    max_tokens while ignore_eos was sent."""
    flags = too_good_flags(where, {k: _median_of(getattr(c.figures, k)) for k in FIGURES}, cfg)
    flags += c.checks
    asked = c.max_tokens
    short = [q for q in c.per_request if isinstance(asked, int) and q.completion_tokens < asked]
    f = (
        short_stream(where, short[0].completion_tokens, asked, short[0].finish_reason, len(short))
        if short and ignore_eos
        else None
    )
    return [*flags, f] if f else flags


def _median_of(r: Range | None) -> Number | None:
    return r.median if r else None


def find_flags(report: RunReport, cfg: BenchConfig) -> list[Flag]:
    """Too-good figures (flagged for audit: judge.py, the lines every mode uses), each cell's cross-checks
    (checks.py), whatever its thinking, and its streams that ended before max_tokens while ignore_eos was sent."""
    lines = cfg.too_good
    ignore_eos = report.options.ignore_eos
    flags: list[Flag] = []

    def check(where: str, figure: str, value: Number | None, line: float) -> None:
        f = too_good(where, figure, value, line)
        if f:
            flags.append(f)

    for t in report.targets:
        for key, c in t.cells.items():
            flags += _cell_flags(f"{t.label} {key}", c, cfg, ignore_eos)
        for step in t.ladder:
            where = f"{t.label} ladder c{step.concurrency}"
            check(where, "aggregate_tok_s", _median_of(step.aggregate_tok_s), lines.aggregate_tok_s)
            flags.extend(step.checks)
            check(where, "per_stream_wall_tok_s", _median_of(step.per_stream_wall_tok_s), lines.wall_tok_s)
            check(where, "per_stream_decode_tok_s", _median_of(step.per_stream_decode_tok_s), lines.decode_tok_s)
    cmp = report.compare
    if cmp:
        for key, figs in cmp.cells.items():
            for fig in FIGURES:
                r = getattr(figs, fig)
                if r and fig != "ttft_s":
                    check(f"compare {key}", f"{fig} ratio", r.median, lines.ratio)
        for rung in cmp.ladder:
            where = f"compare ladder c{rung.concurrency}"
            check(where, "aggregate_tok_s ratio", _median_of(rung.aggregate_tok_s), lines.ratio)
    return flags


def _throttle(gpu: GpuClocks) -> list[Flag]:
    """The flag of a GPU that throttled while the run ran (a clock event reason other than idle)."""
    if not gpu.throttled:
        return []
    return [
        Flag(
            kind="throttle",
            where="gpu",
            figure="clock event reasons",
            value=gpu.throttled_fraction,
            line=0.0,
            note=f"the GPU throttled ({', '.join(gpu.throttle_reasons or {})})",
        )
    ]


def run_config(cfg: BenchConfig) -> RunConfig:
    """The config as the report keeps it: every setting, the prompts by name only."""
    return RunConfig(**cfg.model_dump(exclude={"prompts"}), prompt_names=sorted(cfg.prompts))


def build_report(
    runs: list[TargetRun],
    cfg: BenchConfig,
    *,
    argv: list[str],
    started: str,
    python: str,
    gpu_name: str | None,
    gpu: GpuClocks,
    options: RunOptions,
) -> RunReport:
    """The whole report: targets, comparison, flags, and who ran it how (argv, the GPU, the options)."""
    targets = [target_report(r, cfg.wall_decode_margin) for r in runs]
    report = RunReport(
        tool="qwenquant bench",
        argv=argv,
        started=started,
        python=python,
        gpu_name=gpu_name,
        gpu=gpu,
        options=options,
        config=run_config(cfg),
        targets=targets,
        compare=compare_report(targets[0], targets[1]) if len(targets) == 2 else None,
        failure=next((r.failure for r in runs if r.failure), None),
    )
    report.flags = find_flags(report, cfg) + _throttle(gpu)
    return report
