"""`quantize_arms.py report`: the arms' JSON combined into one table and one JSON.

Measured: per decoder layer (median of layers 1..n, per type), wall, each stage outside the layer
loop by name, GPU and host peaks, the warm-up each arm had before its clock started. With the fp32
arm: the tensor-core artifact against the fp32 one (benchmarks/artifact_compare.py, the engine's
documented tolerance) and each module's weight-error ratio. Projected (labelled): 64 layers on the
measured GPU (one-time costs once) for both arms, and the qwenquant arm on an RTX 3090 by the
per-phase model (benchmarks/phase_model.py). Goals of issue 20 are checked and printed met / not met.
"""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path
from typing import Any

from benchmarks import phase_model as pm
from benchmarks import quantize_bench as qb

GOALS = {
    "layer_ratio": 0.45,
    "layer_ratio_reach": 0.35,
    "whole_minutes": 6.0,
    "whole_ratio": 0.5,
    "gpu_peak_gib": 12.0,
    "rss_gib": 32.0,
    "head_rss_gib": 12.0,
    "weight_error_ratio": 0.001,
}


def _load(work: Path, name: str) -> dict[str, Any] | None:
    p = work / f"arm-{name}.json"
    return json.loads(p.read_text()) if p.is_file() else None


def median_layer(seconds: list[float]) -> float | None:
    rows = seconds[1:] or seconds
    return statistics.median(rows) if rows else None


def compare_fp32(work: Path, keep: bool) -> dict[str, Any] | None:
    """The default artifact against the fp32 one, within the engine's tolerance; fp32 removed after."""
    fp32 = work / "artifact-fp32"
    if not (fp32 / "qwenquant-manifest.json").is_file():
        return None
    from benchmarks.artifact_compare import compare_artifacts

    qb.say("comparing the tensor-core artifact with the fp32 one (reads both and the source)")
    diff = compare_artifacts(fp32, work / "artifact", work / "source", progress=lambda line: qb.say("    " + line))
    out = diff.to_dict()
    out.pop("modules", None)
    out["problems"] = diff.problems()
    out["weight_error_ratios"] = {m: (eb / ea if ea else None) for m, (ea, eb) in diff.weight_errors.items()}
    if not keep:
        shutil.rmtree(fp32, ignore_errors=True)
        shutil.rmtree(work / "artifact-fp32.work", ignore_errors=True)
    return out


def report(work: Path, *, keep_fp32: bool = False) -> dict[str, Any]:
    src = _load(work, "source")
    qq, lc, q32 = _load(work, "qwenquant"), _load(work, "oneshot"), _load(work, "qwenquant-fp32")
    if src is None or qq is None:
        raise SystemExit("run the source and qwenquant steps first")
    ratio = src["bytes_ratio"]
    out: dict[str, Any] = {
        "schema_version": 1,
        "kind": "measured + projected (labelled)",
        "source": src,
        "qwenquant": qq,
        "oneshot": lc,
        "qwenquant_fp32": q32,
    }
    out["projection_64"] = {
        "kind": "projected, not measured",
        "qwenquant": pm.project_qwenquant(qq, ratio),
        "oneshot": pm.project_oneshot(lc, ratio) if lc else None,
    }
    if q32:
        out["projection_64"]["qwenquant_fp32"] = pm.project_qwenquant(q32, ratio)
    out["projection_rtx3090"] = {
        "kind": "projected, not measured",
        "qwenquant": pm.project_3090(qq, src["real_source_bytes"], ratio),
    }
    out["fp32_compare"] = compare_fp32(work, keep_fp32) if q32 else None
    out["goals"] = goals(out)
    print_report(out)
    return out


def goals(r: dict[str, Any]) -> dict[str, Any]:
    qq, lc = r["qwenquant"], r["oneshot"]
    g: dict[str, Any] = {}
    mine = median_layer([x["seconds"] for x in qq["gptq_layers"]])
    if lc and lc.get("median_layer_seconds"):
        theirs = median_layer(lc["per_layer_seconds"])
        g["layer_ratio"] = {
            "value": mine / theirs,
            "goal": f"<= {GOALS['layer_ratio']} (reach {GOALS['layer_ratio_reach']})",
            "met": mine / theirs <= GOALS["layer_ratio"],
        }
        p = r["projection_64"]
        if "total_seconds" in (p["oneshot"] or {}):
            w = p["qwenquant"]["total_seconds"] / p["oneshot"]["total_seconds"]
            g["whole_ratio_64"] = {"value": w, "goal": f"<= {GOALS['whole_ratio']}", "met": w <= GOALS["whole_ratio"]}
    whole = r["projection_64"]["qwenquant"]["total_seconds"] / 60
    g["whole_minutes_64"] = {
        "value": whole,
        "goal": f"<= {GOALS['whole_minutes']}",
        "met": whole <= GOALS["whole_minutes"],
    }
    if qq["peak_gpu_bytes"]:
        gpu = qq["peak_gpu_bytes"] / qb.GIB
        g["gpu_peak_gib"] = {"value": gpu, "goal": f"<= {GOALS['gpu_peak_gib']}", "met": gpu <= GOALS["gpu_peak_gib"]}
    rss = qq["peak_rss_bytes"] / qb.GIB
    g["rss_gib"] = {"value": rss, "goal": f"<= {GOALS['rss_gib']}", "met": rss <= GOALS["rss_gib"]}
    head = next((s for s in qq["stages"] if s["stage"] == "lm_head"), None)
    if head:
        h = head["peak_rss_bytes"] / qb.GIB
        g["lm_head_rss_gib"] = {"value": h, "goal": f"< {GOALS['head_rss_gib']}", "met": h < GOALS["head_rss_gib"]}
    c = r.get("fp32_compare")
    if c:
        worst = c["worst_weight_error_ratio"]
        g["weight_error_vs_fp32"] = {
            "value": worst,
            "goal": f"<= {GOALS['weight_error_ratio']}",
            "met": worst <= GOALS["weight_error_ratio"] and not c["not_identical"],
        }
    return g


def print_report(r: dict[str, Any]) -> None:
    src, qq, lc = r["source"], r["qwenquant"], r["oneshot"]
    d = src["built"]["dims"]
    print(
        f"quantize arms on {qq['device_name']}: {d['layers']} layers (hidden {d['hidden']}, MLP {d['intermediate']}, "
        f"vocab {d['vocab']}), source {src['source_bytes'] / 1e9:.2f} GB, calibration {src['samples']} x "
        f"{src['max_length']}, recipe {src['recipe']}, GPU cap {qq['max_gpu_mem_gib']} GiB"
    )
    print("MEASURED (each arm warmed before its clock started)")
    arms = [("qwenquant", qq)] + ([("qwenquant fp32", r["qwenquant_fp32"])] if r["qwenquant_fp32"] else [])
    for name, a in arms:
        print(
            f"{name} ({a['hessian_precision']} Hessians): warm-up {a['warm_up']['seconds']:.1f} s (untimed), "
            f"wall {a['wall_seconds']:.1f} s, median layer {median_layer([x['seconds'] for x in a['gptq_layers']]):.2f} s, "
            f"GPU peak {qb.fmt_gib(a['peak_gpu_bytes'])}, RSS peak {qb.fmt_gib(a['peak_rss_bytes'])}"
        )
        loop = sum(x["seconds"] for x in a["gptq_layers"])
        for s in a["stages"]:
            extra = f" (layer loop {loop:.1f} s, rest {s['seconds'] - loop:.1f} s)" if s["stage"] == "gptq" else ""
            print(
                f"  stage {s['stage']:<12} {s['seconds']:7.1f} s  GPU {qb.fmt_gib(s['peak_gpu_bytes']):>10}  "
                f"RSS {qb.fmt_gib(s['peak_rss_bytes']):>10}{extra}"
            )
        print(
            "  layer phases, median over layers 1..n (s): "
            + ", ".join(f"{k} {v:.2f}" for k, v in a["gptq_phase_medians"].items())
        )
        print("  layers (s): " + " ".join(f"{x['seconds']:.1f}" for x in a["gptq_layers"]))
        if a.get("gptq_tail"):
            print(
                "  gptq after its loop (s): "
                + ", ".join(f"{k} {v:.2f}" for k, v in a["gptq_tail"].items())
                + "; the rest of its time is config, the stage record's hashing and what was not logged"
            )
    if lc:
        print(
            f"oneshot + save: warm-up {lc['warm_up']['seconds']:.1f} s (untimed), load {lc['load_seconds']:.1f} s, "
            f"oneshot {lc['oneshot_seconds']:.1f} s, save {lc['save_seconds']:.1f} s, wall {lc['wall_seconds']:.1f} s, "
            f"median layer {median_layer(lc['per_layer_seconds']):.2f} s, GPU peak {qb.fmt_gib(lc['peak_gpu_bytes'])}, "
            f"RSS peak {qb.fmt_gib(lc['peak_rss_bytes'])}"
        )
    c = r.get("fp32_compare")
    if c:
        print(
            f"tensor-core vs fp32 artifact: {c['codes_fraction']:.3%} of int4 codes differ (layer 0 "
            f"{c['first_layer_codes_fraction']:.3%}), at most {c['max_steps']} steps, worst weight-error ratio "
            f"{c['worst_weight_error_ratio']:.5f}; problems: {c['problems'] or 'none'}"
        )
    print("PROJECTED to 64 layers on this GPU (not measured)")
    for name, p in r["projection_64"].items():
        if not isinstance(p, dict) or "parts" not in p:
            continue
        parts = ", ".join(f"{k} {v:.0f} s" for k, v in p["parts"].items())
        print(f"  {name}: {p['total_seconds']:.0f} s ({p['total_seconds'] / 60:.1f} min) = {parts}")
    t = r["projection_rtx3090"]["qwenquant"]
    if "total_seconds" in t:
        print(
            f"PROJECTED on an RTX 3090 (per-phase model, not measured): {t['total_seconds'] / 60:.1f} min = layers "
            f"{t['layers_seconds']:.0f} s + lm_head {t['lm_head_seconds']:.0f} s + outside the loop "
            f"{t['outside_loop_seconds']:.0f} s"
        )
        for kind, v in t["per_type"].items():
            eff = ", ".join(f"{k} {e:.2f}" for k, e in v["efficiency"].items() if e is not None)
            print(
                f"  {kind}: H200 efficiency {eff}; 3090 per layer "
                + ", ".join(f"{k} {s:.1f} s" for k, s in v["rtx3090"].items())
            )
    print("GOALS")
    for k, v in r["goals"].items():
        print(f"  {k:<22} {v['value']:.3f}  goal {v['goal']:<18} {'met' if v['met'] else 'NOT MET'}")
