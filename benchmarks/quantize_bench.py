"""Benchmark the real `qwenquant quantize` pipeline on a real-shaped, truncated Qwen3.5 checkpoint.

Builds (benchmarks/shapes.py) a seeded checkpoint with Qwen3.8-27B's widths (hidden 5120, MLP 17408,
vocab 248320, untied head, MTP at real shape) but `--layers` text layers, writes a calibration
jsonl of random words, and runs `pipeline.quantize` in-process with recipe w4a16-int4head and
--source-unverified semantics. Measures per stage: wall time, peak GPU memory (torch allocator,
reset at every stage boundary) and peak host RSS (sampled); per GPTQ decoder layer: time and peak
GPU memory; the lm_head quality report; the artifact's bytes by component. Then a separately
labelled projection to 64 layers. Prints a table (stdout) and writes JSON (--out).

  GPU, real dims:   PYTHONPATH=src:$PYTHONPATH python3 -m benchmarks.quantize_bench
  1 vs 2 GPUs:      PYTHONPATH=src:$PYTHONPATH python3 -m benchmarks.quantize_bench --layers 8 --gpus 2
  CPU proof:        .venv/bin/python -m benchmarks.quantize_bench --quick --scale 0.1 --device cpu

Expectations written before the first GPU run are in benchmarks/README.md. benchmarks/quantize_arms.py runs the
same measurement in pieces (one arm per process, each warmed before it is timed).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import platform
import random
import re
import resource
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REAL_LAYERS = 64
GIB = 2**30


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=4, help="text layers (every 4th full attention); default 4")
    p.add_argument("--samples", type=int, default=None, help="calibration samples (default 128; --quick 8)")
    p.add_argument("--max-length", type=int, default=None, help="tokens per sample (default 2048; --quick 256)")
    p.add_argument("--quick", action="store_true", help="8 samples x 256 tokens")
    p.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="< 1 shrinks hidden/MLP widths and head counts (CPU proofs: 0.1); 1 = the 27B's",
    )
    p.add_argument("--vocab", type=int, default=None, help="override vocab rows (default 248320, the 27B's)")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda when present")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--recipe", default="w4a16-int4head")
    p.add_argument(
        "--enforce-head-gate",
        action="store_true",
        help="keep the recipe's lm_head.require_better_than_rtn (default: off, so a random-weight model "
        "cannot fail the run after minutes; the report says whether the gate would have passed)",
    )
    p.add_argument(
        "--work",
        type=Path,
        default=None,
        help="folder for the checkpoint, calibration set and artifact (default: a temp folder, removed)",
    )
    p.add_argument("--keep", action="store_true", help="keep the work folder")
    p.add_argument(
        "--reference", type=Path, default=None, help="reference config.json (default: ../shared copy or embedded)"
    )
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/quantize_bench.json"))
    p.add_argument(
        "--compare-llmcompressor",
        action="store_true",
        help="after qwenquant, run plain llm-compressor oneshot + save_pretrained on the same source, "
        "scheme, ignore list and calibration tokens, and print the ratios",
    )
    p.add_argument(
        "--progress-file",
        type=Path,
        default=None,
        help="append every progress line to this file as it happens (a run cut off still says where)",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="reuse --work as a killed run left it (source, calibration, stage and layer records): "
        "the gptq stage resumes from its last completed decoder layer",
    )
    p.add_argument(
        "--max-gpu-mem",
        type=float,
        default=None,
        help="GiB: cap this process's CUDA memory (QWENQUANT_MAX_GPU_MEM), e.g. 23.5 for a 24 GB card",
    )
    p.add_argument(
        "--engine",
        choices=("streamed", "oneshot"),
        default="streamed",
        help="qwenquant's gptq engine (QWENQUANT_GPTQ_ENGINE); default streamed",
    )
    p.add_argument(
        "--gpus",
        type=int,
        default=1,
        help="N > 1: after the one-GPU run, quantize again with `--gpus N` (the gptq stage as N processes) "
        "and print one GPU vs N: per-layer and wall time, GPU peak per rank, RSS, speed-up, and the "
        "fraction of int4 codes that differ between the two artifacts",
    )
    args = p.parse_args(argv)
    if args.gpus > 1 and args.engine != "streamed":
        p.error("--gpus runs the streamed engine")
    if args.resume and args.work is None:
        p.error("--resume needs --work (the folder of the run to continue)")
    args.samples = args.samples or (8 if args.quick else 128)
    args.max_length = args.max_length or (256 if args.quick else 2048)
    return args


# ------------------------------------------------------------------------------------------------
# Calibration set


def calibration_words() -> list[str]:
    """Whole-word tokens of the tiny tokenizer (" the", " model", ...), sorted: one token each."""
    from tokenizers import Tokenizer

    from qwenquant.testbed.tiny.tokenizer import tokenizer_json

    vocab = Tokenizer.from_str(tokenizer_json()).get_vocab()
    return sorted(" " + t[1:] for t in vocab if t.startswith("\u0120") and t[1:].isalpha())


def write_calibration(folder: Path, samples: int, max_length: int, seed: int) -> Path:
    """calib.jsonl ({"text": ...} lines of random vocab words, >= max_length tokens each) and its
    calibration definition YAML; returns the YAML path."""
    from tokenizers import Tokenizer

    from qwenquant.testbed.tiny.tokenizer import tokenizer_json

    folder.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer.from_str(tokenizer_json())
    words = calibration_words()
    rng = random.Random(seed)
    lines = []
    for _ in range(samples):
        text = "".join(rng.choice(words) for _ in range(max_length + 8)).lstrip()
        while len(tok.encode(text, add_special_tokens=False).ids) < max_length:
            text += "".join(rng.choice(words) for _ in range(64))
        lines.append(json.dumps({"text": text}))
    (folder / "calib.jsonl").write_text("\n".join(lines) + "\n")
    yaml_path = folder / "quantize-bench.yaml"
    yaml_path.write_text(
        "schema_version: 1\nname: quantize-bench\ndescription: random vocab words written by benchmarks/quantize_bench.py\n"
        f"source: local\npath: calib.jsonl\ntext_field: text\nsplit: train\nnum_samples: {samples}\n"
        f"max_length: {max_length}\nchat_template: false\nshuffle_seed: null\n"
    )
    return yaml_path


# ------------------------------------------------------------------------------------------------
# Measurement


class RssSampler(threading.Thread):
    """Samples this process's RSS every `period` s; `take()` returns the window's peak and resets."""

    def __init__(self, period: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.period = period
        self.peak = 0
        self.stop = threading.Event()
        self.page = os.sysconf("SC_PAGE_SIZE")

    def rss(self) -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * self.page

    def run(self) -> None:
        while not self.stop.wait(self.period):
            self.peak = max(self.peak, self.rss())

    def take(self) -> int:
        peak, self.peak = max(self.peak, self.rss()), 0
        return peak


class Gpu:
    """Peak torch-allocator bytes per window (None on CPU)."""

    def __init__(self, device: str) -> None:
        import torch

        self.torch = torch
        self.on = device == "cuda"

    def take(self) -> int | None:
        if not self.on:
            return None
        self.torch.cuda.synchronize()
        peak = int(self.torch.cuda.max_memory_allocated())
        self.torch.cuda.reset_peak_memory_stats()
        return peak


class Recorder:
    """The pipeline's progress callback: stage boundaries, GPTQ module ticks, lm_head chunk ticks."""

    def __init__(self, gpu: Gpu, rss: RssSampler, layer_modules: list[int], *, engine: str = "streamed") -> None:
        self.gpu, self.rss = gpu, rss
        self.t0 = time.perf_counter()
        self.stages: list[dict[str, Any]] = []
        self.layers: list[dict[str, Any]] = []
        self.chunks: list[float] = []
        self.windows: list[dict[str, Any]] = []  # peak GPU / RSS between marks inside a stage
        # the streamed engine ticks once per decoder layer; oneshot once per quantized module
        self.ends = (
            list(range(1, len(layer_modules) + 1))
            if engine == "streamed"
            else [sum(layer_modules[: i + 1]) for i in range(len(layer_modules))]
        )
        self.head_first = HEAD_FIRST[engine]
        self.total_seen: int | None = None

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def _window(self, stage: str, label: str) -> dict[str, Any]:
        w = {"stage": stage, "label": label, "peak_gpu_bytes": self.gpu.take(), "peak_rss_bytes": self.rss.take()}
        self.windows.append(w)
        return w

    def _close_stage(self, t: float) -> None:
        if self.stages and "seconds" not in self.stages[-1]:
            s = self.stages[-1]
            name = s["stage"]
            self._window(name, "rest of stage" if any(w["stage"] == name for w in self.windows) else "stage")
            mine = [w for w in self.windows if w["stage"] == name]
            s["seconds"] = t - s["start"]
            gpus = [w["peak_gpu_bytes"] for w in mine if w["peak_gpu_bytes"] is not None]
            s["peak_gpu_bytes"] = max(gpus) if gpus else None
            s["peak_rss_bytes"] = max(w["peak_rss_bytes"] for w in mine)
            if len(mine) > 1:
                s["windows"] = [{k: v for k, v in w.items() if k != "stage"} for w in mine]
            say(
                f"  {name:<12} {s['seconds']:7.1f} s  GPU peak {fmt_gib(s['peak_gpu_bytes'])}  "
                f"RSS peak {fmt_gib(s['peak_rss_bytes'])}"
            )

    def __call__(self, name: str, task: str | None, i: int, n: int) -> None:
        t = self.now()
        if name == "gptq" and task is not None:
            self.total_seen = n
            while len(self.layers) < len(self.ends) and i >= self.ends[len(self.layers)]:
                prev = self.layers[-1]["end"] if self.layers else self.stages[-1]["start"]
                k = len(self.layers)
                w = self._window("gptq", f"layer {k}")
                self.layers.append(
                    {
                        "layer": k,
                        "end": t,
                        "seconds": t - prev,
                        "peak_gpu_bytes": w["peak_gpu_bytes"],
                        "peak_rss_bytes": w["peak_rss_bytes"],
                    }
                )
                say(f"    gptq layer {k}: {t - prev:6.1f} s (t={t:.0f} s)")
            return
        if name == "lm_head" and task is not None:
            self.chunks.append(t)
            if i == 1:  # what comes before the head GPTQ (calibration read, or model load) apart from the rows
                self._window("lm_head", self.head_first + ", row chunk 1")
            elif i == n:
                self._window("lm_head", "row chunks 2..n")
            if i == 1 or i == n:
                say(f"    lm_head chunk {i}/{n} (t={t:.0f} s)")
            return
        self._close_stage(t)
        if name != "done":
            self.stages.append({"stage": name, "start": t})
            say(f"stage {name} (t={t:.0f} s)")


def listen(progress_file: Path | None = None) -> None:
    """Logging for a benchmark process: INFO to stderr, the engine's INFO lines to `progress_file` too.
    (The figures come from the run's result, `QuantizeResult.timings`, not from log records.)"""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    for h in logging.getLogger().handlers:
        h.setLevel(logging.INFO)
    if progress_file:  # the engine's own lines (layer i/n, resuming from layer k) go there too
        fh = logging.FileHandler(progress_file)
        fh.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s"))
        fh.setLevel(logging.INFO)
        logging.getLogger("qwenquant").addHandler(fh)


def phase_medians(layers: list[dict[str, float]]) -> dict[str, float]:
    """Median seconds of each phase over the decoder layers, layer 0 left out when there are more
    (it carries the first kernel compilations and an unprefetched read)."""
    rows = layers[1:] or layers
    names = dict.fromkeys(k for r in rows for k in r)
    return {k: statistics.median_high(r.get(k, 0.0) for r in rows) for k in names}


PROGRESS_FILE: list[Path] = []
# The lm_head stage's first step: the streamed engine left the head calibration in the gptq stage
# folder; after the oneshot engine the stage loads the whole model to capture final hidden states.
HEAD_FIRST = {"streamed": "read head calibration", "oneshot": "load model + capture hidden"}
# What the first decoder layer's time carries besides its own GPTQ.
LAYER0_CARRIES = {
    "streamed": "stage setup (source index, calibration embeddings) and an unprefetched read",
    "oneshot": "model load and graph tracing",
}


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
    for p in PROGRESS_FILE:
        with open(p, "a") as f:
            f.write(f"{time.strftime('%H:%M:%S')} {msg}\n")


def fmt_gib(b: int | None) -> str:
    return "-" if b is None else f"{b / GIB:.2f} GiB"


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for dist in ("torch", "transformers", "llmcompressor", "compressed-tensors", "accelerate", "safetensors"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = "not installed"
    return out


def fmt_bytes(b: int | None) -> str:
    if not b:
        return "-"
    return f"{b / 1e9:.3f} GB" if b >= 1e8 else f"{b / 1e6:.2f} MB"


def layer_module_counts(checkpoint: Path, recipe: Any, layers: int) -> list[int]:
    """Linear modules GPTQ quantizes in each decoder layer (2-D weights not ignored by the recipe)."""
    from qwenquant.checkpoint.names import targets_cover
    from qwenquant.checkpoint.tensorfile import checkpoint_refs

    counts = [0] * layers
    pat = re.compile(r"^model\.language_model\.layers\.(\d+)\.(.+)\.weight$")
    for name, ref in checkpoint_refs(checkpoint).items():
        m = pat.match(name)
        if m and len(ref.shape) == 2:
            module = name[: -len(".weight")]
            if not targets_cover(recipe.quantization.ignore, module):
                counts[int(m.group(1))] += 1
    return counts


COMPONENTS = (
    ("embed_tokens", re.compile(r"embed_tokens\.")),
    ("lm_head", re.compile(r"(^|\.)lm_head\.")),
    ("mtp", re.compile(r"^mtp\.")),
    ("vision", re.compile(r"visual\.")),
    ("decoder int4 (packed, scales)", re.compile(r"layers\.\d+\..*\.weight_(packed|scale|shape|zero_point|g_idx)$")),
    ("decoder bf16 Linear", re.compile(r"layers\.\d+\..*(proj(_\w+)?|fc\d?)\.weight$")),
    ("decoder other (norms, conv, A_log, dt_bias)", re.compile(r"layers\.\d+\.")),
)


def sizes_by_component(folder: Path) -> dict[str, int]:
    """Tensor bytes per component, plus headers and side files, from the safetensors headers."""
    from qwenquant.checkpoint.tensorfile import checkpoint_refs, checkpoint_shards

    out: dict[str, int] = {name: 0 for name, _ in COMPONENTS} | {"other tensors (final norm)": 0}
    tensor_bytes = 0
    for name, ref in checkpoint_refs(folder).items():
        key = next((c for c, rx in COMPONENTS if rx.search(name)), "other tensors (final norm)")
        out[key] += ref.nbytes
        tensor_bytes += ref.nbytes
    shard_bytes = sum(p.stat().st_size for p in checkpoint_shards(folder))
    out["safetensors headers"] = shard_bytes - tensor_bytes
    out["other files"] = sum(p.stat().st_size for p in Path(folder).iterdir() if p.is_file()) - shard_bytes
    out = {k: v for k, v in out.items() if v}
    out["total"] = sum(out.values())
    return out


# ------------------------------------------------------------------------------------------------
# ETA and projection


def eta(bytes_: int, layers: int, tokens: int) -> dict[str, float]:
    """A rough guess printed before the run. GPU constants: an earlier llm-compressor run at real dims (about 9 s per decoder layer
    at 128 x 2048 on an H200) and benchmarks/results/lm_head_h200.json (23 s row-chunked head GPTQ)."""
    gb, rel = bytes_ / 1e9, tokens / (128 * 2048)
    g = {
        "build": gb / 0.5,
        "source": gb / 1.5,
        "calibration": 5.0,
        "gptq": 40 + gb / 0.3 + layers * (2 + 10 * rel),
        "lm_head": 20 + gb / 0.5 + 30 + layers * 3 * rel,
        "mtp..manifest": 4 * gb / 0.6,
    }
    g["total"] = sum(g.values())
    return g


def project(report: dict[str, Any], layers: int) -> dict[str, Any]:
    """64-layer projection from measured parts; every term names its basis."""
    st = {s["stage"]: s for s in report["stages"]}
    types = report["checkpoint"]["dims"]["layer_types"]
    by_type: dict[str, list[float]] = {}
    for row in report["gptq_layers"]:
        by_type.setdefault(types[row["layer"]], []).append(row)
    per_type: dict[str, float] = {}
    for kind, rows in by_type.items():
        steady = [r["seconds"] for r in rows if r["layer"] > 0] or [r["seconds"] for r in rows]
        per_type[kind] = sum(steady) / len(steady)
    real_types = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(REAL_LAYERS)]
    missing = [t for t in set(real_types) if t not in per_type]
    if missing:
        return {"skipped": f"no measured layer of type {missing}; use --layers >= 4"}
    streamed = report["engine"] == "streamed"
    rows = report["gptq_layers"]
    # outside the layer loop: what the stage spends after its last layer, plus what layer 0 carries
    # beyond a steady layer of its type (streamed: setup; oneshot: model load and tracing)
    layer0_extra = max(0.0, rows[0]["seconds"] - per_type[types[0]]) if rows else 0.0
    # the stage after its loop grows with the checkpoint; layer 0's excess (kernel compiles, setup) is paid once
    gptq_overhead = st["gptq"]["seconds"] - sum(r["seconds"] for r in rows)
    ratio = report["projection_inputs"]["bytes_ratio"]
    gptq_layers = sum(per_type[t] for t in real_types)
    head = report["lm_head_timing"]
    # streamed: the head calibration read does not grow with depth; oneshot: the model load does
    first = head["before_rows_seconds"] * (1 if streamed else REAL_LAYERS / layers)
    head_total = head["rows_gptq_seconds"] + head["after_rows_seconds"] + first
    io = sum(st[s]["seconds"] for s in ("source", "calibration", "mtp", "textonly", "check", "manifest") if s in st)
    parts = {
        "gptq_layers_seconds": gptq_layers,
        "gptq_overhead_seconds": gptq_overhead * ratio + layer0_extra,
        "lm_head_seconds": head_total,
        "io_stages_seconds": io * ratio,
    }
    parts["total_seconds"] = sum(parts.values())
    parts["per_layer_seconds"] = per_type
    parts["basis"] = {
        "gptq_layers_seconds": "mean measured seconds per layer type (layer 0 left out when another of its type "
        f"exists: it carries {LAYER0_CARRIES[report['engine']]}) x 48 linear + 16 full attention",
        "gptq_overhead_seconds": "measured gptq stage minus its layers x source-bytes ratio, plus layer 0's excess "
        "over a steady layer of its type once (compiles and setup do not grow with depth)",
        "lm_head_seconds": "measured head GPTQ + after-rows part + the part before the rows ("
        + ("head calibration read, as measured" if streamed else "model load + capture x 64/layers")
        + ")",
        "io_stages_seconds": "source, calibration, mtp, textonly, check, manifest x source-bytes ratio",
        "not_included": "checkpoint build (a user fetches), a 24 GB card's CPU offload (this is the same GPU)",
    }
    return parts


def lm_head_timing(rec: Recorder) -> dict[str, float]:
    st = {s["stage"]: s for s in rec.stages}
    s = st.get("lm_head")
    if not s or not rec.chunks:
        return {"rows_gptq_seconds": 0.0, "after_rows_seconds": 0.0, "before_rows_seconds": s["seconds"] if s else 0.0}
    c = rec.chunks
    per_chunk = (c[-1] - c[0]) / (len(c) - 1) if len(c) > 1 else 0.0
    rows = c[-1] - c[0] + per_chunk
    start = s["start"]
    return {
        "rows_gptq_seconds": rows,
        "chunks": len(c),
        "before_rows_seconds": c[0] - per_chunk - start,
        "after_rows_seconds": start + s["seconds"] - c[-1],
    }


# ------------------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from qwenquant.quantize.pipeline import QuantizeOptions, quantize
    from qwenquant.recipe import load_calibration_override, load_recipe

    from benchmarks import shapes

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    work = args.work or Path(tempfile.mkdtemp(prefix="quantize-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    if not args.resume:
        for p in ("source", "calib", "artifact", "artifact.work"):
            shutil.rmtree(work / p, ignore_errors=True)
    shutil.rmtree(work / "artifact", ignore_errors=True)
    for p in (f"artifact-gpus{args.gpus}", f"artifact-gpus{args.gpus}.work"):  # the N-GPU arm starts clean
        shutil.rmtree(work / p, ignore_errors=True)
    ref, ref_from = shapes.reference_config(args.reference)
    dims = shapes.bench_dims(ref, layers=args.layers, scale=args.scale, vocab=args.vocab)
    plan = shapes.tensor_plan(dims, args.seed, device)
    src_bytes = sum(t.nbytes for t in plan.values())
    real_bytes = sum(
        t.nbytes
        for t in shapes.tensor_plan(
            shapes.bench_dims(shapes.REFERENCE_27B, layers=REAL_LAYERS), args.seed, device
        ).values()
    )
    tokens = args.samples * args.max_length
    guess = eta(src_bytes, args.layers, tokens)
    say(
        f"device {device}; {args.layers} layers {dims.layer_types()}; hidden {dims.hidden}, MLP {dims.intermediate}, "
        f"vocab {dims.vocab}; checkpoint {src_bytes / 1e9:.2f} GB; calibration {args.samples} x {args.max_length}"
    )
    if device == "cuda":
        say("ETA (rough H200 guess, before measuring): " + ", ".join(f"{k} {v:.0f} s" for k, v in guess.items()))
    else:
        say("no ETA on CPU (the constants are H200 guesses); --quick --scale 0.05 --vocab 16384 takes seconds")
    if device == "cuda" and guess["total"] > 420:
        say("warning: the ETA is over 7 min; --samples 64 roughly halves the GPTQ calibration part")

    gpu, rss = Gpu(device), RssSampler()
    rss.start()
    if device == "cuda":
        torch.cuda.init()
        gpu.take()
    t0 = time.perf_counter()
    marker = work / "source" / ".bench-built.json"
    if args.resume and marker.is_file():
        built = json.loads(marker.read_text())
        say("  source checkpoint reused (--resume)")
    else:
        built = shapes.build_checkpoint(work / "source", ref, dims, seed=args.seed, device=device)
        marker.write_text(json.dumps(built))
    build = {"seconds": time.perf_counter() - t0, "peak_gpu_bytes": gpu.take(), "peak_rss_bytes": rss.take()}
    say(f"  build        {build['seconds']:7.1f} s  ({src_bytes / 1e9:.2f} GB written)")
    calib_yaml = write_calibration(work / "calib", args.samples, args.max_length, args.seed)

    recipe = load_recipe(args.recipe)
    if not args.enforce_head_gate:
        recipe = recipe.model_copy(
            update={"lm_head": recipe.lm_head.model_copy(update={"require_better_than_rtn": False})}
        )
    spec = load_calibration_override(calib_yaml)
    counts = layer_module_counts(work / "source", recipe, args.layers)
    rec = Recorder(gpu, rss, counts, engine=args.engine)
    opts = QuantizeOptions(
        work / "source", recipe, spec, work / "artifact", work / "artifact.work", device, source_unverified=True
    )
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(sys.stderr):
        result = quantize(opts, rec)
    wall = time.perf_counter() - t0
    phases = result.timings.gptq_layers  # per decoder layer of this process, seconds per phase
    for i, layer in enumerate(phases):
        say(f"    gptq layer {i} phases (s): " + ", ".join(f"{k} {v:.2f}" for k, v in layer.items()))
    compare = None
    if args.compare_llmcompressor:
        from benchmarks.compare_llmcompressor import ratios, run_oneshot_arm

        say("llm-compressor oneshot arm (same source, scheme, ignore list, calibration tokens)")
        lc = run_oneshot_arm(
            work / "source", work / "artifact.work" / "calibration", recipe, work / "oneshot-save", gpu, rss, say
        )
        layer_s = sorted(L["seconds"] for L in rec.layers[1:]) or [None]
        gptq = next((s for s in rec.stages if s["stage"] == "gptq"), {})
        mine = {
            "median_layer_seconds": layer_s[len(layer_s) // 2],
            "wall_seconds": wall,
            "peak_rss_bytes": max(s["peak_rss_bytes"] for s in rec.stages),
            "peak_gpu_bytes": max((s["peak_gpu_bytes"] or 0) for s in rec.stages) or None,
            "gptq_stage_seconds": gptq.get("seconds"),
        }
        compare = {"llmcompressor": lc, "qwenquant": mine, "ratios_qwenquant_over_llmcompressor": ratios(mine, lc)}
        say(
            "ratios qwenquant / llm-compressor: "
            + ", ".join(
                f"{k} {v:.2f}" for k, v in compare["ratios_qwenquant_over_llmcompressor"].items() if v is not None
            )
        )
    gpus = None
    if args.gpus > 1:
        from benchmarks.artifact_compare import compare_artifacts
        from benchmarks.gpus_compare import run_gpus_arm, summarize

        many = run_gpus_arm(args.gpus, work, recipe, spec, device, Recorder(gpu, rss, counts, engine=args.engine), say)
        one = {"wall_seconds": wall, "stages": rec.stages, "layers": rec.layers, "phases": phase_medians(phases)}
        diff = compare_artifacts(
            result.artifact, Path(many["artifact"]), work / "source", progress=lambda line: say("    " + line)
        )
        for r in many["ranks"]:
            r["phase_medians"] = phase_medians(r.get("phase_seconds") or [])
        gpus = summarize(one, many, diff, diff.problems())
    rss.stop.set()

    records = {}
    for s in rec.stages:
        p = work / "artifact.work" / f"{s['stage']}.record.json"
        if p.is_file():
            r = json.loads(p.read_text())
            records[s["stage"]] = {"started": r["started"], "finished": r["finished"], "result": r["result"]}
    report: dict[str, Any] = {
        "schema_version": 1,
        "kind": "measured",
        "device": device,
        "device_name": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or platform.machine(),
        "host_cpus": os.cpu_count(),
        "versions": versions(),
        "reference": ref_from,
        "recipe": args.recipe,
        "head_gate_enforced": args.enforce_head_gate,
        "checkpoint": built,
        "calibration": {
            "samples": args.samples,
            "max_length": args.max_length,
            "token_total": result.calibration.get("token_total"),
            "fingerprint_sha256": result.calibration.get("fingerprint_sha256"),
        },
        "build": build,
        "stages": [{k: v for k, v in s.items()} for s in rec.stages],
        "stage_records": records,
        "gptq_layers": [dict(r, type=dims.layer_types()[r["layer"]], modules=counts[r["layer"]]) for r in rec.layers],
        "gptq_module_ticks_total": rec.total_seen,
        "gptq_layer_phases": phases,
        "gptq_phase_medians": phase_medians(phases),
        "lm_head_timing": lm_head_timing(rec),
        "lm_head_quality": result.quality.get("lm_head"),
        "artifact_bytes": sizes_by_component(result.artifact),
        "source_bytes": sizes_by_component(work / "source"),
        "quantize_wall_seconds": wall,
        "engine": args.engine,
        "max_gpu_mem_gib": args.max_gpu_mem,
        "compare_llmcompressor": compare,
        "gpus_compare": gpus,
        "host_max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "eta_guess_h200": guess if device == "cuda" else None,
        "projection_inputs": {"bytes_ratio": real_bytes / src_bytes, "real_source_bytes": real_bytes},
    }
    if args.engine == "oneshot" and rec.total_seen is not None and rec.total_seen != sum(counts):
        report["warning"] = f"llm-compressor counted {rec.total_seen} target modules, the bench {sum(counts)}"
    q = report["lm_head_quality"] or {}
    if q.get("gptq") and q.get("rtn"):
        report["head_gate_would_pass"] = q["gptq"]["kl"] < q["rtn"]["kl"]
    report["projection_64_layers"] = {"kind": "projected, not measured"} | project(report, args.layers)
    if args.scale < 1 or args.vocab:
        report["projection_64_layers"]["caveat"] = "small dims (--scale/--vocab): not a projection of the 27B"
    if args.work is None and not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    else:
        report["work"] = str(work)
    return report


def print_table(r: dict[str, Any]) -> None:
    c, d = r["checkpoint"], r["checkpoint"]["dims"]
    print(
        f"qwenquant quantize on {r['device_name']} ({r['device']}): {d['layers']} layers, hidden {d['hidden']}, "
        f"MLP {d['intermediate']}, vocab {d['vocab']}, checkpoint {c['bytes'] / 1e9:.2f} GB; "
        f"calibration {r['calibration']['samples']} x {r['calibration']['max_length']} "
        f"({r['calibration']['token_total']} tokens)"
    )
    print("MEASURED")
    print(f"{'step':<40} {'seconds':>8} {'peak GPU':>10} {'peak RSS':>10}")
    b = r["build"]
    print(
        f"{'build checkpoint (bench)':<40} {b['seconds']:>8.1f} {fmt_gib(b['peak_gpu_bytes']):>10} {fmt_gib(b['peak_rss_bytes']):>10}"
    )
    for s in r["stages"]:
        print(
            f"{'stage ' + s['stage']:<40} {s['seconds']:>8.1f} {fmt_gib(s['peak_gpu_bytes']):>10} {fmt_gib(s['peak_rss_bytes']):>10}"
        )
        if s["stage"] == "gptq":
            for L in r["gptq_layers"]:
                note = " *" if L["layer"] == 0 else ""
                label = f"  layer {L['layer']} {L['type']} ({L['modules']} mod){note}"
                print(
                    f"{label:<40} {L['seconds']:>8.1f} {fmt_gib(L['peak_gpu_bytes']):>10} {fmt_gib(L['peak_rss_bytes']):>10}"
                )
        if s["stage"] == "lm_head":
            h = r["lm_head_timing"]
            w = {x["label"]: x for x in s.get("windows", [])}
            before = HEAD_FIRST[r["engine"]]
            first, rows = w.get(before + ", row chunk 1", {}), w.get("row chunks 2..n", {})
            rest = w.get("rest of stage", {})
            for label, secs, win in (
                (f"  {before} (+chunk 1)", h["before_rows_seconds"], first),
                ("  row-chunked head GPTQ (chunks 2..n)", h["rows_gptq_seconds"], rows),
                ("  RTN, KL compare, pack, write", h["after_rows_seconds"], rest),
            ):
                print(
                    f"{label:<40} {secs:>8.1f} {fmt_gib(win.get('peak_gpu_bytes')):>10} "
                    f"{fmt_gib(win.get('peak_rss_bytes')):>10}"
                )
    print(f"  * layer 0 also carries {LAYER0_CARRIES[r['engine']]}")
    if r.get("gptq_phase_medians"):
        print(
            "  decoder layer phases, median over layers 1..n (s): "
            + ", ".join(f"{k} {v:.2f}" for k, v in r["gptq_phase_medians"].items())
        )
    print(
        f"{'quantize total (pipeline.quantize)':<40} {r['quantize_wall_seconds']:>8.1f} {'':>10} {fmt_gib(r['host_max_rss_bytes']):>10}"
    )
    q = r["lm_head_quality"] or {}
    if q.get("gptq"):
        print(
            f"lm_head held-out ({q['heldout_tokens']} tokens): KL RTN {q['rtn']['kl']:.5g} / GPTQ {q['gptq']['kl']:.5g} "
            f"(KL reduction {q['kl_reduction_pct']:.1f}%; recipe gate {'passes' if r.get('head_gate_would_pass') else 'WOULD FAIL'}), top-1 RTN {q['rtn']['top1']:.4f} / GPTQ {q['gptq']['top1']:.4f}"
        )
    print(f"{'bytes by component':<44} {'source':>10} {'artifact':>10}")
    keys = [c for c, _ in COMPONENTS] + ["other tensors (final norm)", "safetensors headers", "other files", "total"]
    for k in keys:
        s, a = r["source_bytes"].get(k), r["artifact_bytes"].get(k)
        if s or a:
            print(f"{k:<44} {fmt_bytes(s):>10} {fmt_bytes(a):>10}")
    c = r.get("compare_llmcompressor")
    if c:
        lc, me, ra = c["llmcompressor"], c["qwenquant"], c["ratios_qwenquant_over_llmcompressor"]
        print("LLM-COMPRESSOR ONESHOT, same source/scheme/ignore/calibration, same process (measured)")
        print(f"{'figure':<28} {'qwenquant':>12} {'oneshot':>12} {'ratio':>7}")
        for k, fmt in (
            ("median_layer_seconds", lambda v: f"{v:.1f} s"),
            ("wall_seconds", lambda v: f"{v:.1f} s"),
            ("peak_rss_bytes", fmt_gib),
            ("peak_gpu_bytes", fmt_gib),
        ):
            a, b = me.get(k), lc.get(k)
            print(
                f"{k:<28} {fmt(a) if a is not None else '-':>12} {fmt(b) if b is not None else '-':>12} "
                f"{(f'{ra[k]:.2f}' if ra.get(k) else '-'):>7}"
            )
        print(
            f"  oneshot: load {lc['load_seconds']:.1f} s, oneshot {lc['oneshot_seconds']:.1f} s, "
            f"save {lc['save_seconds']:.1f} s (wall = all three); qwenquant wall = every stage + manifest"
        )
    if r.get("gpus_compare"):
        from benchmarks.gpus_compare import print_gpus

        print_gpus(r["gpus_compare"], fmt_gib)
    p = r["projection_64_layers"]
    print("PROJECTION to 64 layers (not measured; basis in the JSON)" + (f" -- {p['caveat']}" if "caveat" in p else ""))
    if "skipped" in p:
        print(f"  skipped: {p['skipped']}")
        return
    per = ", ".join(f"{k} {v:.1f} s" for k, v in p["per_layer_seconds"].items())
    print(f"  per layer: {per}")
    print(
        f"  gptq layers {p['gptq_layers_seconds']:.0f} s + gptq overhead {p['gptq_overhead_seconds']:.0f} s + "
        f"lm_head {p['lm_head_seconds']:.0f} s + I/O stages {p['io_stages_seconds']:.0f} s = "
        f"{p['total_seconds']:.0f} s ({p['total_seconds'] / 60:.1f} min)"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from qwenquant.atomic import atomic_write_json

    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # llm-compressor picks cuda whenever it is visible
    os.environ.setdefault("TQDM_DISABLE", "1")
    os.environ["QWENQUANT_GPTQ_ENGINE"] = args.engine
    if args.max_gpu_mem:
        os.environ["QWENQUANT_MAX_GPU_MEM"] = str(args.max_gpu_mem)
    if args.progress_file:
        PROGRESS_FILE.append(args.progress_file)
        args.progress_file.parent.mkdir(parents=True, exist_ok=True)
    listen(args.progress_file)
    report = run(args)
    print_table(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out, report, canonical=False)
    say(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
