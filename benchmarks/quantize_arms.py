"""The quantize bench in pieces, one arm per process, each warmed before it is timed.

A real-shaped, truncated Qwen3.8-27B (benchmarks/shapes.py, as quantize_bench.py builds it) quantized by
qwenquant (`pipeline.quantize`, the streamed engine) and by llm-compressor `oneshot` + save, each in
its own command so that every piece fits a time limit and the source is built once:

  W=/tmp/qbench; export PYTHONUNBUFFERED=1
  python3 -m benchmarks.quantize_arms source    --work $W --layers 16        # the source checkpoint + calibration jsonl
  python3 -m benchmarks.quantize_arms qwenquant --work $W --max-gpu-mem 23.5  # artifact kept: $W/artifact
  python3 -m benchmarks.quantize_arms oneshot   --work $W --max-gpu-mem 23.5  # reads qwenquant's calibration tokens
  python3 -m benchmarks.quantize_arms qwenquant --work $W --max-gpu-mem 23.5 --hessian-precision fp32  # quality arm
  python3 -m benchmarks.quantize_arms report    --work $W --out benchmarks/results/quantize_arms_h200.json

CPU proof of the plumbing (small widths; the figures mean nothing):
  for s in "source --layers 4 --scale 0.05 --vocab 16384 --samples 4 --max-length 128" qwenquant oneshot \
           "qwenquant --hessian-precision fp32" report; do .venv/bin/python -m benchmarks.quantize_arms $s --work /tmp/qa; done

Warm-up, before an arm's clock starts and reported apart: one calibration-length sample through one
decoder layer of each type (flash-linear-attention's Triton kernels compile, or load from
~/.triton/cache, and cuBLAS picks its kernels), and a timed Hessian product at three widths in
both precisions (the rates the per-phase model uses). Both arms call the same warm-up, so neither
is timed while the other has compiled. Each arm writes $W/arm-<name>.json; `report` combines them:
measured table, each stage outside the layer loop by name, the ratios, a 64-layer projection that
counts one-time costs once (benchmarks/phase_model.py), and an RTX 3090 projection by the per-phase model.
Every step prints progress lines as it goes (stderr) and --progress-file keeps them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import phase_model as pm
from benchmarks import quantize_bench as qb

ARMS = ("qwenquant", "qwenquant-fp32", "oneshot")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("step", choices=("source", "qwenquant", "oneshot", "report"))
    p.add_argument("--work", type=Path, required=True, help="folder shared by the steps (source, artifacts, arm JSON)")
    p.add_argument("--layers", type=int, default=16, help="source: text layers (every 4th full attention)")
    p.add_argument("--samples", type=int, default=128, help="source: calibration samples")
    p.add_argument("--max-length", type=int, default=2048, help="source: tokens per sample")
    p.add_argument("--scale", type=float, default=1.0, help="source: < 1 shrinks the widths (CPU proofs: 0.05)")
    p.add_argument("--vocab", type=int, default=None, help="source: vocab rows (default the 27B's 248320)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--recipe", default="w4a16-int4head-multimodal")
    p.add_argument("--max-gpu-mem", type=float, default=None, help="GiB cap of this process's CUDA memory")
    p.add_argument(
        "--hessian-precision",
        choices=("tensor-core", "fp32"),
        default="tensor-core",
        help="qwenquant arm: the recipe's quantization.hessian_precision (fp32: a separate artifact)",
    )
    p.add_argument(
        "--drop-work",
        action="store_true",
        help="qwenquant arm: after the run, remove its work folder but the calibration stage (the artifact "
        "is hard-linked from it and stays; the oneshot arm reads the calibration tokens)",
    )
    p.add_argument("--keep-fp32", action="store_true", help="report: keep the fp32 arm's artifact (default: removed)")
    p.add_argument("--progress-file", type=Path, default=None)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/quantize_arms.json"))
    return p.parse_args(argv)


def arm_path(work: Path, name: str) -> Path:
    return work / f"arm-{name}.json"


def disk(work: Path) -> dict[str, float]:
    u = shutil.disk_usage(work)
    return {"free_gb": u.free / 1e9, "used_gb": u.used / 1e9}


# ------------------------------------------------------------------------------------------------ warm-up


def warm_up(source: Path, max_length: int, device: str) -> dict[str, Any]:
    """One sample through one layer of each type, and the Hessian product rates; untimed for the arm."""
    import torch

    from qwenquant.checkpoint.tensorfile import checkpoint_refs
    from qwenquant.modeling.text import LayerInputs, build_layer, open_source, read_layer

    t0 = time.perf_counter()
    src = open_source(source, checkpoint_refs(source))
    types = src.config.layer_types
    inputs = LayerInputs(src, device)
    for kind in dict.fromkeys(types):
        i = types.index(kind)
        layer = build_layer(src, i, read_layer(src, i), device)
        x = torch.randn(1, max_length, int(src.config.hidden_size), dtype=torch.bfloat16, device=device) * 0.02
        with torch.no_grad():
            layer(x, **inputs.kwargs(x, kind))
        del layer, x
        qb.say(f"  warm-up: one {kind} layer forward done (t={time.perf_counter() - t0:.1f} s)")
    c = src.config
    widths = tuple(
        sorted(
            {
                int(c.hidden_size),
                int(c.intermediate_size),
                int(getattr(c, "linear_num_value_heads", 0) * getattr(c, "linear_value_head_dim", 0)),
            }
            - {0}
        )
    )
    rates = hessian_rates(max_length, device, widths)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    qb.say("  warm-up: Hessian product rates " + ", ".join(f"{k} {v / 1e12:.0f} TFLOP/s" for k, v in rates.items()))
    return {"seconds": time.perf_counter() - t0, "hessian_rates": rates}


def hessian_rates(n: int, device: str, widths: tuple[int, ...]) -> dict[str, float]:
    """FLOP/s of one sample's Hessian product (n tokens) at the model's input widths (the 27B's:
    5120, 6144, 17408), both paths."""
    import torch

    from qwenquant.modeling.compat import gram

    out = {}
    for precision in ("tensor-core", "fp32"):
        flops, secs = 0.0, 0.0
        for d in widths:
            x = torch.randn(n, d, dtype=torch.bfloat16, device=device)
            h = torch.zeros(d, d, dtype=torch.float32, device=device)
            for rep in range(4):
                if device == "cuda":
                    torch.cuda.synchronize()
                t = time.perf_counter()
                h.add_(gram(x, precision), alpha=2)
                if device == "cuda":
                    torch.cuda.synchronize()
                if rep:  # the first call picks kernels
                    flops, secs = flops + 2.0 * n * d * d, secs + time.perf_counter() - t
            del x, h
        out[precision] = flops / secs
    return out


# ------------------------------------------------------------------------------------------------ steps


def step_source(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from benchmarks import shapes

    device = "cuda" if torch.cuda.is_available() else "cpu"
    ref, ref_from = shapes.reference_config(None)
    dims = shapes.bench_dims(ref, layers=args.layers, scale=args.scale, vocab=args.vocab)
    shutil.rmtree(args.work / "source", ignore_errors=True)
    t0 = time.perf_counter()
    built = shapes.build_checkpoint(args.work / "source", ref, dims, seed=args.seed, device=device)
    qb.write_calibration(args.work / "calib", args.samples, args.max_length, args.seed)
    src_bytes = sum(t.nbytes for t in shapes.tensor_plan(dims, args.seed, device).values())
    real = sum(
        t.nbytes for t in shapes.tensor_plan(shapes.bench_dims(ref, layers=pm.REAL_LAYERS), args.seed, device).values()
    )
    info = {
        "built": built,
        "reference": ref_from,
        "seconds": time.perf_counter() - t0,
        "source_bytes": src_bytes,
        "real_source_bytes": real,
        "bytes_ratio": real / src_bytes,
        "samples": args.samples,
        "max_length": args.max_length,
        "recipe": args.recipe,
        "disk": disk(args.work),
        "scale": args.scale,
        "vocab": args.vocab,
    }
    qb.say(
        f"source: {args.layers} layers, {src_bytes / 1e9:.2f} GB in {info['seconds']:.0f} s; "
        f"disk free {info['disk']['free_gb']:.0f} GB"
    )
    return info


def _load_source(args: argparse.Namespace) -> dict[str, Any]:
    p = arm_path(args.work, "source")
    if not p.is_file():
        raise SystemExit(f"{p} is missing: run the `source` step first")
    return json.loads(p.read_text())


def step_qwenquant(args: argparse.Namespace, device: str) -> dict[str, Any]:
    import torch

    from qwenquant.checkpoint.names import targets_cover
    from qwenquant.checkpoint.tensorfile import checkpoint_refs
    from qwenquant.quantize.pipeline import QuantizeOptions, quantize
    from qwenquant.recipe import load_calibration_override, load_recipe

    src_info = _load_source(args)
    fp32 = args.hessian_precision == "fp32"
    art = args.work / ("artifact-fp32" if fp32 else "artifact")
    for p in (art, art.with_name(art.name + ".work")):
        shutil.rmtree(p, ignore_errors=True)
    warm = warm_up(args.work / "source", src_info["max_length"], device)
    recipe = load_recipe(src_info["recipe"]).with_hessian_precision(args.hessian_precision)
    recipe = recipe.model_copy(update={"lm_head": recipe.lm_head.model_copy(update={"require_better_than_rtn": False})})
    spec = load_calibration_override(args.work / "calib" / "quantize-bench.yaml")
    n = src_info["built"]["dims"]["layers"]
    counts = qb.layer_module_counts(args.work / "source", recipe, n)
    gpu, rss = qb.Gpu(device), qb.RssSampler()
    rss.start()
    gpu.take()
    rec = qb.Recorder(gpu, rss, counts, engine="streamed")
    opts = QuantizeOptions(
        args.work / "source", recipe, spec, art, art.with_name(art.name + ".work"), device, source_unverified=True
    )
    qb.say(f"qwenquant arm ({args.hessian_precision} Hessians): timing starts")
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(sys.stderr):
        result = quantize(opts, rec)
    wall = time.perf_counter() - t0
    rss.stop.set()
    phases, tail = result.timings.gptq_layers, result.timings.gptq_tail
    if args.drop_work:
        drop_work(art.with_name(art.name + ".work"))
    refs = checkpoint_refs(args.work / "source")
    shapes_ = pm.layer_shapes(refs, lambda m: targets_cover(recipe.quantization.ignore, m))
    tokens = src_info["samples"] * src_info["max_length"]
    return {
        "arm": "qwenquant-fp32" if fp32 else "qwenquant",
        "hessian_precision": args.hessian_precision,
        "device_name": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "versions": qb.versions(),
        "warm_up": warm,
        "hessian_rates": warm["hessian_rates"],
        "wall_seconds": wall,
        "stages": rec.stages,
        "gptq_layers": rec.layers,
        "gptq_layer_phases": phases,
        "gptq_phase_medians": qb.phase_medians(phases),
        "gptq_tail": tail,
        "layer_types": src_info["built"]["dims"]["layer_types"],
        "layer_flops": {str(i): pm.layer_flops(m, tokens) for i, m in shapes_.items()},
        "lm_head_timing": qb.lm_head_timing(rec),
        "lm_head_quality": result.quality.get("lm_head"),
        "root_digest": result.root_digest,
        "artifact": str(result.artifact),
        "artifact_bytes": qb.sizes_by_component(result.artifact),
        "max_gpu_mem_gib": args.max_gpu_mem,
        "peak_gpu_bytes": max((s["peak_gpu_bytes"] or 0) for s in rec.stages) or None,
        "peak_rss_bytes": max(s["peak_rss_bytes"] for s in rec.stages),
        "disk": disk(args.work),
    }


def drop_work(work: Path) -> None:
    """Everything in a quantize work folder but the calibration stage's folder and record."""
    for p in work.iterdir():
        if not p.name.startswith("calibration"):
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    qb.say(f"  removed {work} but its calibration stage")


def step_oneshot(args: argparse.Namespace, device: str) -> dict[str, Any]:
    import torch

    from qwenquant.recipe import load_recipe

    from benchmarks.compare_llmcompressor import run_oneshot_arm

    src_info = _load_source(args)
    tokens = args.work / "artifact.work" / "calibration"
    if not tokens.is_dir():
        raise SystemExit(f"{tokens} is missing: run the `qwenquant` step first (its calibration stage tokenizes)")
    if device == "cuda" and args.max_gpu_mem:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, args.max_gpu_mem * 2**30 / total))
    warm = warm_up(args.work / "source", src_info["max_length"], device)
    gpu, rss = qb.Gpu(device), qb.RssSampler()
    rss.start()
    qb.say("oneshot arm: timing starts")
    lc = run_oneshot_arm(
        args.work / "source", tokens, load_recipe(src_info["recipe"]), args.work / "oneshot-save", gpu, rss, qb.say
    )
    rss.stop.set()
    return {
        "arm": "oneshot",
        "warm_up": warm,
        "layer_types": src_info["built"]["dims"]["layer_types"],
        "device_name": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "versions": qb.versions(),
        "max_gpu_mem_gib": args.max_gpu_mem,
        **lc,
        "disk": disk(args.work),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TQDM_DISABLE", "1")
    if args.max_gpu_mem:
        os.environ["QWENQUANT_MAX_GPU_MEM"] = str(args.max_gpu_mem)
    if args.progress_file:
        qb.PROGRESS_FILE.append(args.progress_file)
    qb.listen(args.progress_file)
    from qwenquant.atomic import atomic_write_json

    if args.step == "report":
        from benchmarks.arms_report import report

        r = report(args.work, keep_fp32=args.keep_fp32)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(args.out, r, canonical=False)
        qb.say(f"wrote {args.out}")
        return 0
    if args.step == "source":
        info = step_source(args)
        atomic_write_json(arm_path(args.work, "source"), info, canonical=False)
        return 0
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    res = step_qwenquant(args, device) if args.step == "qwenquant" else step_oneshot(args, device)
    atomic_write_json(arm_path(args.work, res["arm"]), res, canonical=False)
    qb.say(f"{res['arm']}: wall {res['wall_seconds']:.1f} s; wrote {arm_path(args.work, res['arm'])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
