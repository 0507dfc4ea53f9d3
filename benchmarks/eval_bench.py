"""Time `qwenquant eval`'s layer-streamed forward on a real-shaped, truncated Qwen3.5 checkpoint.

Builds and quantizes a checkpoint with Qwen3.8-27B's widths and `--layers` text layers through
benchmarks/quantize_bench.py (or reuses one: `--work W` holding `source/` and `artifact/` from
`quantize_bench.py --keep --work W`), then runs the offline eval (evaluate/offline.py,
`streamed=True`) on `--windows` x `--window-len` random token windows. Measures: wall time, time per
decoder layer (both arms), the fixed part (heads, metrics, MTP), peak GPU memory and host RSS;
projects the default eval (32 x 256) at 64 layers. Prints a table, writes JSON (--out).

  GPU, real dims:   PYTHONPATH=src:$PYTHONPATH python3 -m benchmarks.eval_bench --layers 4 --max-gpu-mem 23.5
  CPU proof:        .venv/bin/python -m benchmarks.eval_bench --layers 4 --scale 0.05 --vocab 16384 --device cpu \
                        --windows 4 --window-len 64

Expectations written before the first GPU run are in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REAL_LAYERS, DEFAULT_WINDOWS, DEFAULT_LEN = 64, 32, 256


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--scale", type=float, default=1.0, help="< 1 shrinks widths (CPU proofs); 1 = the 27B's")
    p.add_argument("--vocab", type=int, default=None, help="vocab rows (default 248320, the 27B's)")
    p.add_argument("--windows", type=int, default=DEFAULT_WINDOWS)
    p.add_argument("--window-len", type=int, default=DEFAULT_LEN)
    p.add_argument("--device", choices=("cpu", "cuda"), default=None)
    p.add_argument("--max-gpu-mem", type=float, default=None, help="cap GPU memory in GiB (23.5: a 24 GB card)")
    p.add_argument("--work", type=Path, default=None, help="reuse/keep source/ and artifact/ here")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("benchmarks/reports/eval_bench.json"))
    return p.parse_args(argv)


class LayerTimes(logging.Handler):
    """Collects the streamed forward's per-layer lines ("eval: decoder layer i/n, both arms (s)")."""

    PATTERN = re.compile(r"eval: decoder layer (\d+)/(\d+), both arms \(([\d.]+) s\)")

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.seconds: list[float] = []

    def emit(self, record: logging.LogRecord) -> None:
        m = self.PATTERN.search(record.getMessage())
        if m:
            self.seconds.append(float(m.group(3)))


def ensure_artifact(args: argparse.Namespace, work: Path, device: str) -> None:
    """source/ and artifact/ under `work`, built and quantized by quantize_bench.py unless present."""
    if (work / "artifact" / "qwenquant-manifest.json").is_file() and (work / "source" / "config.json").is_file():
        return
    from benchmarks import quantize_bench

    argv = [
        "--layers",
        str(args.layers),
        "--scale",
        str(args.scale),
        "--device",
        device,
        "--work",
        str(work),
        "--keep",
        "--quick",
        "--out",
        str(work / "quantize_bench.json"),
    ]
    argv += ["--vocab", str(args.vocab)] if args.vocab else []
    argv += ["--max-gpu-mem", str(args.max_gpu_mem)] if args.max_gpu_mem else []
    quantize_bench.main(argv)


def project(r: dict[str, Any]) -> dict[str, Any]:
    """The default eval (32 x 256) at 64 layers. Per-layer time and the fixed part (heads, metrics, MTP)
    scale with tokens; the first layer's excess over the median (kernel compilation and autotuning,
    once per process) is counted once, unscaled."""
    scale = (DEFAULT_WINDOWS * DEFAULT_LEN) / (r["windows"] * r["window_len"])
    per_layer = r["median_layer_seconds"] * scale
    warmup = max(0.0, r["layer_seconds"][0] - r["median_layer_seconds"]) if r["layer_seconds"] else 0.0
    fixed = max(0.0, r["wall_seconds"] - sum(r["layer_seconds"])) * scale
    return {
        "layers": REAL_LAYERS,
        "windows": DEFAULT_WINDOWS,
        "window_len": DEFAULT_LEN,
        "per_layer_seconds": per_layer,
        "fixed_seconds": fixed,
        "first_layer_warmup_seconds": warmup,
        "total_seconds": fixed + warmup + per_layer * REAL_LAYERS,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from qwenquant.evaluate.offline import run_offline, weight_bytes
    from qwenquant.quantize.engine.run import apply_gpu_cap

    from benchmarks.quantize_bench import Gpu, RssSampler, versions

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    work = args.work or Path(tempfile.mkdtemp(prefix="eval-bench-"))
    ensure_artifact(args, work, device)
    apply_gpu_cap(device, args.max_gpu_mem)
    vocab = int(__import__("json").loads((work / "source" / "config.json").read_text())["text_config"]["vocab_size"])
    windows = torch.randint(
        0, vocab, (args.windows, args.window_len), generator=torch.Generator().manual_seed(args.seed)
    )
    times, gpu, rss = LayerTimes(), Gpu(device), RssSampler()
    logging.getLogger("qwenquant").addHandler(times)
    rss.start()
    gpu.take()
    t0 = time.perf_counter()
    report = run_offline(work / "source", work / "artifact", windows, device=device, streamed=True)
    wall = time.perf_counter() - t0
    layer_s = sorted(times.seconds) or [float("nan")]
    r = {
        "tool": "benchmarks/eval_bench.py",
        "device": device,
        "layers": len(times.seconds),
        "windows": args.windows,
        "window_len": args.window_len,
        "source_bytes": weight_bytes(work / "source"),
        "artifact_bytes": weight_bytes(work / "artifact"),
        "wall_seconds": wall,
        "layer_seconds": times.seconds,
        "median_layer_seconds": layer_s[len(layer_s) // 2],
        "peak_gpu_bytes": gpu.take(),
        "peak_rss_bytes": rss.take(),
        "figures": {
            "artifact_delta_pct": report["arms"]["artifact"]["delta_pct"],
            "kl": report["arms"]["artifact"]["kl"],
        },
        "gpu_name": torch.cuda.get_device_name(0) if device == "cuda" else None,
        "versions": versions(),
    }
    r["projection_64_layers"] = project(r)
    return r


def print_table(r: dict[str, Any]) -> None:
    gib = lambda b: "n/a" if b is None else f"{b / 2**30:.2f} GiB"
    p = r["projection_64_layers"]
    rows = [
        ("device", f"{r['device']} {r['gpu_name'] or ''}".strip()),
        (
            "checkpoint",
            f"{r['layers']} layers, source {r['source_bytes'] / 1e9:.2f} GB, artifact "
            f"{r['artifact_bytes'] / 1e9:.2f} GB",
        ),
        ("windows", f"{r['windows']} x {r['window_len']} tokens"),
        ("wall", f"{r['wall_seconds']:.1f} s"),
        (
            "per decoder layer (both arms)",
            "median {:.2f} s; all: {}".format(
                r["median_layer_seconds"], ", ".join(f"{s:.2f}" for s in r["layer_seconds"])
            ),
        ),
        ("peak GPU / host RSS", f"{gib(r['peak_gpu_bytes'])} / {gib(r['peak_rss_bytes'])}"),
        (
            "projected: default eval, 64 layers",
            f"{p['total_seconds'] / 60:.1f} min "
            f"({p['per_layer_seconds']:.2f} s/layer x 64 + {p['fixed_seconds']:.0f} s fixed "
            f"+ {p['first_layer_warmup_seconds']:.0f} s first-layer warm-up, projected)",
        ),
    ]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from qwenquant.atomic import atomic_write_json

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    r = run(args)
    print_table(r)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out, r, canonical=False)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
