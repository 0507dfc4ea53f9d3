"""The `--gpus N` arm of quantize_bench.py: the same `pipeline.quantize` again with the gptq stage as
an N-process job (one GPU per rank, NCCL), on the same source, recipe and calibration set, then the
two artifacts compared (benchmarks/artifact_compare.py: fraction of int4 codes that differ, steps).

Per-layer times come from rank 0's progress ticks (the same Recorder as the one-GPU arm); each
rank's peak GPU memory (torch allocator), peak RSS and phases come from the run's result
(`QuantizeResult.timings.gptq_ranks`); the stage's own process is measured as in the one-GPU arm.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def run_gpus_arm(
    gpus: int, work: Path, recipe: Any, spec: Any, device: str, rec: Any, say: Callable[[str], None]
) -> dict[str, Any]:
    """Quantize with `gpus` processes into work/artifact-gpusN; return its measurements."""
    import torch

    from qwenquant.quantize.pipeline import QuantizeOptions, quantize

    if device == "cuda":
        torch.cuda.empty_cache()  # the one-GPU arm's cached blocks back to the driver before the ranks start
    out = work / f"artifact-gpus{gpus}"
    opts = QuantizeOptions(
        work / "source",
        recipe,
        spec,
        out,
        work / f"artifact-gpus{gpus}.work",
        device,
        source_unverified=True,
        gpus=gpus,
    )
    say(f"{gpus}-process arm (--gpus {gpus}: same source, recipe, calibration)")
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(sys.stderr):
        result = quantize(opts, rec)
    wall = time.perf_counter() - t0
    ranks = result.timings.gptq_ranks
    return {
        "gpus": gpus,
        "artifact": str(out),
        "wall_seconds": wall,
        "stages": rec.stages,
        "layers": rec.layers,
        "ranks": ranks,
    }


def summarize(one: dict[str, Any], many: dict[str, Any], diff: Any, tolerance_problems: list[str]) -> dict[str, Any]:
    """The figures the table prints: medians, stage times, speed-ups, per-rank memory, the difference."""

    def median_layer(layers: list[dict[str, Any]]) -> float | None:
        s = sorted(r["seconds"] for r in layers[1:]) or sorted(r["seconds"] for r in layers)
        return s[len(s) // 2] if s else None

    def stage(arm: dict[str, Any], name: str, key: str = "seconds") -> Any:
        return next((s.get(key) for s in arm["stages"] if s["stage"] == name), None)

    rows = {
        "median_layer_seconds": (median_layer(one["layers"]), median_layer(many["layers"])),
        "gptq_stage_seconds": (stage(one, "gptq"), stage(many, "gptq")),
        "quantize_wall_seconds": (one["wall_seconds"], many["wall_seconds"]),
    }
    speedup = {k: (a / b if a and b else None) for k, (a, b) in rows.items()}
    return {
        "gpus": many["gpus"],
        "figures": {k: {"one": a, "many": b} for k, (a, b) in rows.items()},
        "speedup": speedup,
        "gptq_gpu_peak_one_bytes": stage(one, "gptq", "peak_gpu_bytes"),
        "gptq_rss_peak_one_bytes": stage(one, "gptq", "peak_rss_bytes"),
        "ranks": many["ranks"],
        "stage_process_rss_peak_many_bytes": max((s.get("peak_rss_bytes") or 0) for s in many["stages"]),
        "host_rss_ranks_sum_bytes": sum(r["peak_rss_bytes"] for r in many["ranks"]) or None,
        "artifact_difference": diff.to_dict(),
        "within_tolerance": not tolerance_problems,
        "tolerance_problems": tolerance_problems,
        "per_layer_many": many["layers"],
        "phase_medians_one": one.get("phases") or {},
    }


def print_gpus(s: dict[str, Any], fmt_gib: Callable[[Any], str]) -> None:
    n = s["gpus"]
    print(f"ONE GPU vs {n} GPUS (--gpus {n}), same source, recipe and calibration, this call (measured)")
    print(f"{'figure':<28} {'1 GPU':>10} {f'{n} GPUs':>10} {'speed-up':>9}")
    for k, v in s["figures"].items():
        a, b, x = v["one"], v["many"], s["speedup"][k]
        print(
            f"{k:<28} {(f'{a:.1f} s' if a is not None else '-'):>10} {(f'{b:.1f} s' if b is not None else '-'):>10} "
            f"{(f'{x:.2f}x' if x else '-'):>9}"
        )
    print(
        f"gptq GPU peak: 1 GPU {fmt_gib(s['gptq_gpu_peak_one_bytes'])}; per rank "
        + ", ".join(f"rank {r['rank']} {fmt_gib(r['peak_gpu_bytes'])}" for r in s["ranks"])
    )
    print(
        f"host RSS peak: 1 GPU gptq {fmt_gib(s['gptq_rss_peak_one_bytes'])}; {n} GPUs: ranks "
        + " + ".join(fmt_gib(r["peak_rss_bytes"]) for r in s["ranks"])
        + f" (stage process {fmt_gib(s['stage_process_rss_peak_many_bytes'])})"
    )
    one = s.get("phase_medians_one") or {}
    if one or any(r.get("phase_medians") for r in s["ranks"]):
        names = list(dict.fromkeys([*one, *(k for r in s["ranks"] for k in r.get("phase_medians") or {})]))
        print(
            "decoder layer phases, median over layers 1..n (s): "
            + "  ".join(
                f"{k} {one.get(k, 0.0):.2f}/"
                + "/".join(f"{(r.get('phase_medians') or {}).get(k, 0.0):.2f}" for r in s["ranks"])
                for k in names
            )
            + f"  (1 GPU/rank 0/.../rank {n - 1})"
        )
    d = s["artifact_difference"]
    print(
        f"artifact difference: {d['codes_fraction']:.3%} of {d['codes_total']:,} int4 codes differ (decoder layer 0: "
        f"{d['first_layer_codes_fraction']:.3%}), at most {d['max_steps']} step(s), in "
        f"{d['modules_with_differences']} modules; worst weight-error change {d['worst_weight_error_ratio']:.2%}; "
        f"every other tensor and file "
        f"{'byte-identical' if not d['not_identical'] else 'NOT identical: ' + ', '.join(d['not_identical'][:5])}"
    )
    print(
        f"tolerance (docs/distributed-gptq.md): {'within' if s['within_tolerance'] else 'OUTSIDE: '}"
        + "; ".join(s["tolerance_problems"][:5])
    )
