"""The run as a JSON-ready report with its flags, and as table sections for the console (pure)."""

from __future__ import annotations

import statistics
from typing import Any

from qwenquant.bench import metrics
from qwenquant.bench.checks import cell_checks, merge_checks
from qwenquant.bench.judge import short_stream, too_good, too_good_flags
from qwenquant.bench.modes import SCHEMA_VERSION
from qwenquant.bench.parts import Flag, flags_of
from qwenquant.bench.rates import (
    FIGURES,
    cell_figures,
    ratio_spread,
    sample_figures,
    spread,
    wave_aggregate,
)
from qwenquant.bench.runner import TargetRun
from qwenquant.bench.stream import Sample
from qwenquant.bench.workload import BenchConfig, Cell


def _median(v: list[float | None]) -> float | None:
    v2 = [x for x in v if x is not None]
    return statistics.median(v2) if v2 else None


def _round_medians(rounds: list[list[Sample]]) -> dict[str, list[float | None]]:
    per = [[sample_figures(s) for s in r] for r in rounds]
    return {k: [_median([p[k] for p in r]) for r in per] for k in FIGURES}


def _cell_report(cell: Cell, rounds: list[list[Sample]], where: str, margin: float) -> dict[str, Any]:
    flat = [s for r in rounds for s in r]
    figs = cell_figures(flat)
    fields: dict[str, int] = {}
    for s in flat:
        if s.first_field:
            fields[s.first_field] = fields.get(s.first_field, 0) + 1
    return {
        "prompt": cell.prompt,
        "sampling": cell.sampling,
        "thinking": cell.thinking,
        "concurrency": cell.concurrency,
        "figures": {k: v.as_dict() if v else None for k, v in figs.items()},
        "round_medians": _round_medians(rounds),
        "requests": len(flat),
        "short_requests": sum(s.short for s in flat),
        "max_tokens": flat[0].max_tokens if flat else None,
        "prompt_tokens": _median([float(s.prompt_tokens) for s in flat]),
        "completion_tokens": sum(s.completion_tokens for s in flat),
        "first_text_field": fields,
        "reasoning_streamed": any(s.reasoning_streamed for s in flat),
        "per_request": [
            {
                **sample_figures(s),
                "prompt_tokens": s.prompt_tokens,
                "completion_tokens": s.completion_tokens,
                "first_field": s.first_field,
                "finish_reason": s.finish_reason,
                "text_events": s.text_events,
                "streamed_tokens": s.streamed_tokens,
                "streamed_exact": s.exact,
                "reasoning_tokens": s.reasoning_tokens,
            }
            for s in flat
        ],
        "checks": cell_checks(flat, where, margin),
    }


def _ladder_report(run: TargetRun) -> list[dict[str, Any]]:
    out = []
    for cell in run.ladder:
        rounds = run.waves.get(cell.key, [])
        waves = [w for r in rounds for w in r]
        flat = [s for w in waves for s in w]
        per = [sample_figures(s) for s in flat]
        agg = spread(wave_aggregate(w) for w in waves)
        out.append(
            {
                "concurrency": cell.concurrency,
                "cell": cell.key,
                "aggregate_tok_s": agg.as_dict() if agg else None,
                "checks": merge_checks(run.queued.get(cell.key, [])),
                "aggregate_round_medians": [_median([wave_aggregate(w) for w in r]) for r in rounds],
                "per_stream_wall_tok_s": _as(spread(p["wall_tok_s"] for p in per)),
                "per_stream_decode_tok_s": _as(spread(p["decode_tok_s"] for p in per)),
            }
        )
    return out


def _as(s: Any) -> dict[str, float] | None:
    return s.as_dict() if s else None


def target_report(run: TargetRun, margin: float) -> dict[str, Any]:
    t = run.target
    acc = metrics.acceptance(run.spec) if run.metrics_exported else {"metrics_page": False, "speculative": None}
    return {
        "label": t.label,
        "url": t.url,
        "model": t.model,
        **t.info,
        "thinking": run.thinking_note,
        "acceptance": acc,
        "cells": {c.key: _cell_report(c, run.samples.get(c.key, []), f"{t.label} {c.key}", margin) for c in run.cells},
        "ladder": _ladder_report(run),
    }


def compare_report(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Per cell and figure: the per-round ratio A/B as median and range (rounds paired in order)."""
    cells = {}
    for key in a["cells"]:
        if key not in b["cells"]:
            continue
        ra, rb = a["cells"][key]["round_medians"], b["cells"][key]["round_medians"]
        cells[key] = {k: _as(ratio_spread(ra[k], rb[k])) for k in FIGURES}
    ladder = []
    for la, lb in zip(a["ladder"], b["ladder"], strict=False):
        if la["concurrency"] == lb["concurrency"]:
            ladder.append(
                {
                    "concurrency": la["concurrency"],
                    "aggregate_tok_s": _as(ratio_spread(la["aggregate_round_medians"], lb["aggregate_round_medians"])),
                }
            )
    return {"a": a["label"], "b": b["label"], "ratio": "A/B", "cells": cells, "ladder": ladder}


def find_flags(report: dict[str, Any], cfg: BenchConfig) -> list[Flag]:
    """Too-good figures (flagged for audit: judge.py, the lines every mode uses), each cell's cross-checks
    (checks.py), whatever its thinking, and its streams that ended before max_tokens while ignore_eos was sent."""
    lines = cfg.too_good.model_dump()
    ignore_eos = (report.get("options") or {}).get("ignore_eos", True)
    flags: list[Flag] = []

    def check(where: str, figure: str, value: float | None, line: float) -> None:
        f = too_good(where, figure, value, line)
        if f:
            flags.append(f)

    for t in report["targets"]:
        for key, c in t["cells"].items():
            where = f"{t['label']} {key}"
            flags += too_good_flags(where, {k: (v or {}).get("median") for k, v in c["figures"].items()}, cfg)
            flags.extend(flags_of(c["checks"]))
            asked = c.get("max_tokens")
            short = [q for q in c["per_request"] if isinstance(asked, int) and q["completion_tokens"] < asked]
            f = (
                short_stream(where, short[0]["completion_tokens"], asked, short[0].get("finish_reason"), len(short))
                if short and ignore_eos
                else None
            )
            if f:
                flags.append(f)
        for step in t["ladder"]:
            where = f"{t['label']} ladder c{step['concurrency']}"
            check(where, "aggregate_tok_s", (step["aggregate_tok_s"] or {}).get("median"), lines["aggregate_tok_s"])
            flags.extend(flags_of(step.get("checks") or []))
            for fig, line in (("per_stream_wall_tok_s", "wall_tok_s"), ("per_stream_decode_tok_s", "decode_tok_s")):
                check(where, fig, (step[fig] or {}).get("median"), lines[line])
    cmp = report.get("compare")
    if cmp:
        for key, figs in cmp["cells"].items():
            for fig, r in figs.items():
                if r and fig != "ttft_s":
                    check(f"compare {key}", f"{fig} ratio", r["median"], lines["ratio"])
        for step in cmp["ladder"]:
            check(
                f"compare ladder c{step['concurrency']}",
                "aggregate_tok_s ratio",
                (step["aggregate_tok_s"] or {}).get("median"),
                lines["ratio"],
            )
    return flags


def build_report(runs: list[TargetRun], cfg: BenchConfig, *, meta: dict[str, Any]) -> dict[str, Any]:
    """The whole JSON document: targets, comparison, flags, and `meta` (argv, GPU, options)."""
    targets = [target_report(r, cfg.wall_decode_margin) for r in runs]
    report: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        **meta,
        "config": cfg.model_dump(exclude={"prompts"}) | {"prompt_names": sorted(cfg.prompts)},
        "targets": targets,
        "compare": compare_report(targets[0], targets[1]) if len(targets) == 2 else None,
    }
    report["failure"] = next((r.failure for r in runs if r.failure), None)
    report["flags"] = find_flags(report, cfg)
    gpu = report.get("gpu") or {}
    if gpu.get("throttled"):
        report["flags"].append(
            Flag(
                kind="throttle",
                where="gpu",
                figure="clock event reasons",
                value=gpu.get("throttled_fraction"),
                line=0.0,
                note=f"the GPU throttled ({', '.join(gpu.get('throttle_reasons', {}))})",
            )
        )
    return report
