"""Benchmark the row-chunked GPTQ lm_head against RTN: wall time, peak GPU memory, KL, top-1.

Random head weights and synthetic final-norm-like hidden states (random orthogonal basis,
power-law spectrum, a few loud channels), so KL numbers depend on that synthetic spectrum:
they show the machinery works and GPTQ exploits correlation, not what the real 27B head gets.

  GPU, real shape:  python -m benchmarks.lm_head_bench
  GPU, quick:       python -m benchmarks.lm_head_bench --quick
  CPU, small:       python -m benchmarks.lm_head_bench --device cpu --threads 1 --vocab 8192 --hidden 1024 \\
                        --calib-tokens 4096 --eval-tokens 512 --row-chunks 512,2048,all
  The stage:        python -m benchmarks.lm_head_bench --stage [--row-chunk auto|N]
  The stage, CPU:   python -m benchmarks.lm_head_bench --stage --device cpu --vocab 16384 --eval-tokens 512

--stage runs the lm_head stage's tensor work once (head_gptq.quantize_head: GPTQ, the KL compare
against RTN, packing; `row_chunk: auto` resolved as the stage does) and reports the seconds of each
part and the host memory it added: the peak of a 10 ms RSS sampler above the RSS before it (the
head is made inside the stage, as the stage reads it from the checkpoint).

Prints a table to stdout and writes JSON (--out, default benchmarks/results/lm_head.json).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import resource
import sys
import time
from pathlib import Path
from typing import Any

import torch

from qwenquant.atomic import atomic_write_json
from qwenquant.modeling.head_quality import heads_quality
from qwenquant.modeling.runtime import torch_device
from qwenquant.quantize.head_gptq import (
    accumulate_hessian,
    gptq_quantize_rows,
    rtn_quantize_rows,
)

from benchmarks.quantize_bench import RssSampler

DEFAULT_OUT = Path("benchmarks/results/lm_head.json")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vocab", type=int, default=248320)
    p.add_argument("--hidden", type=int, default=5120)
    p.add_argument("--calib-tokens", type=int, default=8192, help="tokens in the Hessian")
    p.add_argument("--eval-tokens", type=int, default=2048, help="held-out tokens for KL / top-1")
    p.add_argument("--row-chunks", default="4096,8192,32768,all", help="comma list; 'all' = one chunk")
    p.add_argument("--group-size", type=int, default=128)
    p.add_argument("--block-size", type=int, default=128)
    p.add_argument("--actorder", action="store_true", help="sweep columns by descending H_ii")
    p.add_argument(
        "--spectrum-exp",
        type=float,
        default=0.6,
        help="hidden-state std along the k-th basis direction ~ k^-exp (0 = isotropic control)",
    )
    p.add_argument("--logit-std", type=float, default=3.5, help="std of reference logits")
    p.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (1 is fastest on a busy 2-core box)")
    p.add_argument("--quick", action="store_true", help="row chunk 8192 only, 1024 eval tokens")
    p.add_argument(
        "--stage", action="store_true", help="the stage's parts and host peak instead of the row-chunk table"
    )
    p.add_argument("--row-chunk", default="auto", help="with --stage: rows at a time, or auto (default)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"default {DEFAULT_OUT} (--stage: lm_head_stage.json)")
    args = p.parse_args(argv)
    if args.quick:
        args.row_chunks = "8192"
        args.eval_tokens = min(args.eval_tokens, 1024)
    return args


def parse_chunks(text: str, vocab: int) -> list[int]:
    out = []
    for part in text.split(","):
        part = part.strip()
        out.append(vocab if part == "all" else min(int(part), vocab))
    return out


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def reset_peak(dev: torch.device) -> None:
    if dev.type == "cuda":
        sync(dev)
        torch.cuda.reset_peak_memory_stats(dev)


def peak_bytes(dev: torch.device) -> int | None:
    return int(torch.cuda.max_memory_allocated(dev)) if dev.type == "cuda" else None


class Synthetic:
    """Hidden states x = (z * spectrum) @ Q with a few loud channels; W ~ N(0, sigma^2)."""

    def __init__(self, hidden: int, dev: torch.device, seed: int, exponent: float = 0.6) -> None:
        self.dev = dev
        self.gen = torch.Generator(device=dev).manual_seed(seed)
        g = torch.randn(hidden, hidden, generator=self.gen, device=dev)
        self.basis, _ = torch.linalg.qr(g)
        k = torch.arange(1, hidden + 1, device=dev, dtype=torch.float32)
        spectrum = k.pow(-exponent)
        self.spectrum = spectrum * math.sqrt(hidden / float(spectrum.square().sum()))  # rms 1 per dim
        self.loud = torch.randperm(hidden, generator=self.gen, device=dev)[:4]

    def hidden(self, n: int) -> torch.Tensor:
        z = torch.randn(n, self.spectrum.numel(), generator=self.gen, device=self.dev) * self.spectrum
        x = z @ self.basis
        x[:, self.loud] *= 8.0
        return x

    def head(self, vocab: int, hidden: int, logit_std: float, rows: int = 16384) -> torch.Tensor:
        """bf16 weights on the CPU, as a loaded checkpoint holds them."""
        rms2 = float(self.hidden(2048).square().mean())
        sigma = logit_std / math.sqrt(hidden * rms2)
        W = torch.empty((vocab, hidden), dtype=torch.bfloat16)
        for r0 in range(0, vocab, rows):
            r1 = min(r0 + rows, vocab)
            W[r0:r1] = (
                (torch.randn(r1 - r0, hidden, generator=self.gen, device=self.dev) * sigma).to(torch.bfloat16).cpu()
            )
        return W


def estimate(vocab: int, hidden: int, chunks: list[int]) -> str:
    flop = vocab * hidden * hidden  # block-error propagation, the bulk of one sweep
    lines = [f"sweep ~{flop / 1e12:.2f} TFLOP fp32 per pass (V*D^2); per-column launches: "]
    for rc in chunks:
        n = math.ceil(vocab / rc)
        lines.append(f"  row_chunk {rc}: {n} chunks x {hidden} columns = {n * hidden} column steps")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.threads:
        torch.set_num_threads(args.threads)
    dev = torch_device(args.device)
    chunks = parse_chunks(args.row_chunks, args.vocab)
    print(
        f"device {dev}; head {args.vocab} x {args.hidden}; calib {args.calib_tokens} tok; eval {args.eval_tokens} tok",
        file=sys.stderr,
    )
    print(estimate(args.vocab, args.hidden, chunks), file=sys.stderr)
    torch.manual_seed(args.seed)
    t0 = time.perf_counter()
    syn = Synthetic(args.hidden, dev, args.seed, args.spectrum_exp)
    W = syn.head(args.vocab, args.hidden, args.logit_std)
    H, n = None, 0
    for start in range(0, args.calib_tokens, 1024):
        H, n = accumulate_hessian(H, syn.hidden(min(1024, args.calib_tokens - start)), n)
    held_out = syn.hidden(args.eval_tokens)
    sync(dev)
    setup_s = time.perf_counter() - t0

    rows: list[dict[str, Any]] = []
    reset_peak(dev)
    t0 = time.perf_counter()
    rtn_chunk = min(8192, args.vocab)
    rtn = rtn_quantize_rows(W, group_size=args.group_size, row_chunk=rtn_chunk, device=dev)
    sync(dev)
    rows.append(
        {
            "method": "rtn",
            "row_chunk": rtn_chunk,
            "seconds": time.perf_counter() - t0,
            "peak_gpu_bytes": peak_bytes(dev),
        }
    )

    heads = []
    for rc in chunks:
        reset_peak(dev)
        t0 = time.perf_counter()
        q = gptq_quantize_rows(
            W,
            H,
            group_size=args.group_size,
            block_size=args.block_size,
            row_chunk=rc,
            actorder=args.actorder,
            device=dev,
        )
        sync(dev)
        row = {
            "method": "gptq",
            "row_chunk": rc,
            "seconds": time.perf_counter() - t0,
            "peak_gpu_bytes": peak_bytes(dev),
        }
        if heads:
            row["codes_differing_from_first"] = float((q.int != heads[0].int).double().mean())
        row["rtn_fallback"] = q.used_rtn_fallback
        rows.append(row)
        heads.append(q)
        print(f"  gptq row_chunk {rc}: {row['seconds']:.1f} s", file=sys.stderr)

    reset_peak(dev)
    t0 = time.perf_counter()
    quality = heads_quality(W, [rtn.dequantize()] + [q.dequantize() for q in heads], held_out, device=dev)
    sync(dev)
    eval_s = time.perf_counter() - t0
    for row, qual in zip(rows, quality, strict=True):
        row.update(kl=qual["kl"], top1=qual["top1"])
    rtn_kl = rows[0]["kl"]
    for row in rows[1:]:
        row["kl_reduction_pct"] = 100.0 * (1.0 - row["kl"] / rtn_kl) if rtn_kl > 0 else 0.0
    return {
        "schema_version": 1,
        "device": str(dev),
        "device_name": torch.cuda.get_device_name(dev)
        if dev.type == "cuda"
        else platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "shape": [args.vocab, args.hidden],
        "group_size": args.group_size,
        "block_size": args.block_size,
        "actorder": args.actorder,
        "spectrum_exp": args.spectrum_exp,
        "calib_tokens": args.calib_tokens,
        "eval_tokens": args.eval_tokens,
        "setup_seconds": setup_s,
        "eval_seconds": eval_s,
        "eval_peak_gpu_bytes": peak_bytes(dev),
        "host_max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "results": rows,
    }


def run_stage(args: argparse.Namespace) -> dict[str, Any]:
    """One quantize_head run as the lm_head stage makes it: per-part seconds and host peak."""
    from types import SimpleNamespace

    from qwenquant.quantize.head_gptq import quantize_head
    from qwenquant.quantize.head_memory import resolve_row_chunk
    from qwenquant.quantize.stages.lm_head import gpu_budget

    if args.threads:
        torch.set_num_threads(args.threads)
    dev = torch_device(args.device)
    syn = Synthetic(args.hidden, dev, args.seed, args.spectrum_exp)
    H, n = None, 0
    for start in range(0, args.calib_tokens, 1024):
        H, n = accumulate_hessian(H, syn.hidden(min(1024, args.calib_tokens - start)), n)
    held_out = syn.hidden(args.eval_tokens).cpu()  # the stage loads the held-out states on the host
    H = H.cpu()
    asked = args.row_chunk if args.row_chunk == "auto" else int(args.row_chunk)
    row_chunk = resolve_row_chunk(
        asked, args.vocab, args.hidden, gpu_budget(dev.type), group_size=args.group_size, block_size=args.block_size
    )
    spec = SimpleNamespace(
        method="gptq",
        num_bits=4,
        group_size=args.group_size,
        symmetric=True,
        dampening_frac=0.01,
        block_size=args.block_size,
    )
    reset_peak(dev)
    rss = RssSampler(period=0.01)  # quantize_bench's sampler: this process's RSS, peak per window
    before = rss.rss()
    rss.start()
    t0 = time.perf_counter()
    done = quantize_head(
        lambda: syn.head(args.vocab, args.hidden, args.logit_std), H, held_out, spec, row_chunk=row_chunk, device=dev
    )
    total = time.perf_counter() - t0
    peak = rss.take()
    rss.stop.set()
    return {
        "schema_version": 1,
        "mode": "stage",
        "device": str(dev),
        "torch": torch.__version__,
        "shape": [args.vocab, args.hidden],
        "row_chunk_asked": args.row_chunk,
        "row_chunk": row_chunk,
        "seconds": {**done.seconds, "total": total},
        "host_rss_before_bytes": before,
        "host_peak_added_bytes": peak - before,
        "peak_gpu_bytes": peak_bytes(dev),
        "head_bf16_bytes": args.vocab * args.hidden * 2,
        "report": done.report,
    }


def print_stage(report: dict[str, Any]) -> None:
    secs = report["seconds"]
    print(
        f"lm_head stage {report['shape'][0]}x{report['shape'][1]} on {report['device']}, "
        f"row_chunk {report['row_chunk']} (asked {report['row_chunk_asked']})"
    )
    print(f"{'part':<8} {'seconds':>8}")
    for part in ("gptq", "rtn", "compare", "pack", "total"):
        print(f"{part:<8} {secs.get(part, 0.0):>8.2f}")
    print(
        f"host peak added {fmt_bytes(report['host_peak_added_bytes'])} (head bf16 "
        f"{fmt_bytes(report['head_bf16_bytes'])}, RSS before {fmt_bytes(report['host_rss_before_bytes'])}), "
        f"peak GPU {fmt_bytes(report['peak_gpu_bytes'])}"
    )


def fmt_bytes(b: int | None) -> str:
    return "-" if b is None else f"{b / 2**30:.2f} GiB"


def print_table(report: dict[str, Any]) -> None:
    print(
        f"lm_head {report['shape'][0]}x{report['shape'][1]} g{report['group_size']} on {report['device_name']} ({report['device']})"
    )
    print(
        f"{'method':<6} {'row_chunk':>9} {'seconds':>8} {'peak GPU':>10} {'KL (nats)':>11} {'top-1':>7} {'KL vs RTN':>10} {'codes != first':>14}"
    )
    for r in report["results"]:
        red = f"{-r['kl_reduction_pct']:+.1f}%" if "kl_reduction_pct" in r else "-"
        diff = f"{r['codes_differing_from_first']:.2e}" if "codes_differing_from_first" in r else "-"
        print(
            f"{r['method']:<6} {r['row_chunk']:>9} {r['seconds']:>8.2f} {fmt_bytes(r['peak_gpu_bytes']):>10} "
            f"{r['kl']:>11.5f} {r['top1']:>7.4f} {red:>10} {diff:>14}"
        )
    print(
        f"setup {report['setup_seconds']:.1f} s, eval {report['eval_seconds']:.1f} s (peak GPU {fmt_bytes(report['eval_peak_gpu_bytes'])}), host max RSS {fmt_bytes(report['host_max_rss_bytes'])}"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.stage:
        report = run_stage(args)
        print_stage(report)
        out = args.out if args.out != DEFAULT_OUT else args.out.with_name("lm_head_stage.json")
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(out, report, canonical=False)
        print(f"wrote {out}", file=sys.stderr)
        return 0
    report = run(args)
    print_table(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out, report, canonical=False)
    print(f"wrote {args.out}", file=sys.stderr)
    print(json.dumps({"kl_reduction_pct": [r.get("kl_reduction_pct") for r in report["results"][1:]]}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
