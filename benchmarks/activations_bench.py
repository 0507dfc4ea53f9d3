"""int8 against bf16 activations, one server at a time: what `qwenquant serve --activations int8` buys.

For each setting (bf16, then int8): `qwenquant serve ARTIFACT --profile P --gpu-mem 24GiB --activations S`
until `ready`, then against its URL:
  decode   `qwenquant bench run URL --prompts narrative --sampling greedy --thinking off --max-tokens 128
            --repeats 2 --max-concurrency 16`: the concurrency ladder 1, 2, 4, 8, 16
  prefill  `qwenquant bench depth URL --depths 2048 --max-tokens 16`: one fresh 2,048-token prompt
  burst    `qwenquant bench depth URL --depths 2048 --concurrency 16 --max-tokens 16`: 16 at once
and the server is stopped (Ctrl-C, exit 130 expected) before the next setting starts. vLLM's log says
which linear kernel it chose ("Using MarlinLinearKernel for CompressedTensorsWNA16"): int8 activations
exist only in Marlin, so a setting that ran on another kernel measured nothing of them, and the table
says so. On SM 9.x vLLM prefers Machete, which ignores the setting: `--force-marlin` (the default)
disables the kernels vLLM prefers on SM 9.0 for both settings (serving.marlin_only: the list `qwenquant serve
--activations int8` sets), so Hopper runs the kernel a GeForce Ampere card runs. Each bench report keeps its own cross-check flags; their count is in the table.

  python -m benchmarks.activations_bench ARTIFACT --vllm .venv-vllm/qwenquant-vllm.json [--profile batch]
      [--gpu-mem 24GiB] [--settings bf16,int8] [--no-force-marlin] [--out benchmarks/results/activations.json]
      [-- vLLM flags]

Expected (written before the run; an H200 with Marlin forced, the 64-layer real-shaped artifact, the
batch profile, hard 24 GiB): burst of 16 x 2,048 total prefill +10% to +30% with int8 (about +19% was
seen once), its TTFT median down by as much; one 2,048-token prompt +0% to +25%; decode at 16 streams
-5% to +5%; decode at one stream -10% to +3%. Too good to believe: any prefill gain above +60% (int8
doubles the tensor-core peak, but the GDN layers and attention do not take it) or any decode gain
above +15% (decode reads weights, which int8 activations do not shrink).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from qwenquant.bench.modes import BenchReport, DepthReport, RunReport, load_report
from qwenquant.bench.parts import DepthRung, Number

from benchmarks.serving import kernels_of, marlin_only, qwenquant_cli, serving

FIGURES = (  # (key, label, higher is better)
    ("decode_c1_tok_s", "decode, 1 stream (tok/s)", True),
    ("decode_c16_tok_s", "decode, 16 streams, total (tok/s)", True),
    ("prefill_1x2048_tok_s", "prefill, 1 x 2,048 (tok/s)", True),
    ("burst_prefill_tok_s", "burst 16 x 2,048, prefill total (tok/s)", True),
    ("burst_ttft_median_s", "burst 16 x 2,048, TTFT median (s)", False),
    ("burst_ttft_max_s", "burst 16 x 2,048, TTFT max (s)", False),
)
TOO_GOOD = {"prefill": 0.60, "decode": 0.15}  # int8/bf16 - 1 above these is not believed without a reason


def ladder_figure(run_report: RunReport | None, concurrency: int, key: str) -> Number | None:
    """A `bench run` ladder rung's median figure (aggregate_tok_s or per_stream_decode_tok_s)."""
    for target in run_report.targets if run_report else []:
        for rung in target.ladder:
            figure = getattr(rung, key)
            if rung.concurrency == concurrency and figure is not None:
                return figure.median
    return None


def depth_rung(depth_report: DepthReport | None) -> DepthRung | None:
    """The first rung of a `bench depth` report (None when it has none)."""
    return depth_report.rungs[0] if depth_report and depth_report.rungs else None


def figures(run: RunReport | None, single: DepthReport | None, burst: DepthReport | None) -> dict[str, Any]:
    """The table's figures of one setting from its three typed bench reports (a missing report: None figures)."""
    one, many = depth_rung(single), depth_rung(burst)
    ttft = many.ttft if many else None
    return {
        "decode_c1_tok_s": ladder_figure(run, 1, "per_stream_decode_tok_s"),
        "decode_c16_tok_s": ladder_figure(run, 16, "aggregate_tok_s"),
        "prefill_1x2048_tok_s": one.prefill_tok_s if one else None,
        "burst_prefill_tok_s": many.prefill_tok_s if many else None,
        "burst_ttft_median_s": ttft.median if ttft else None,
        "burst_ttft_max_s": ttft.max if ttft else None,
        "flags": sum(len(r.flags) for r in (run, single, burst) if r),
    }


def compare(base: dict[str, Any], other: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows (figure, bf16, int8, change): change is int8/bf16 - 1 for rates, bf16/int8 - 1 for times (so
    a positive change is always a gain); a gain beyond TOO_GOOD is flagged "too good"."""
    rows = []
    for key, label, higher in FIGURES:
        a, b = base.get(key), other.get(key)
        change = None
        if a and b:
            change = (b / a - 1) if higher else (a / b - 1)
        limit = TOO_GOOD["decode" if key.startswith("decode") else "prefill"]
        rows.append(
            {
                "figure": key,
                "label": label,
                "bf16": a,
                "int8": b,
                "change": change,
                "too_good": change is not None and change > limit,
            }
        )
    return rows


def table(rows: list[dict[str, Any]], settings: dict[str, dict[str, Any]]) -> str:
    def fmt(x: float | None) -> str:
        return "-" if x is None else (f"{x:,.0f}" if abs(x) >= 100 else f"{x:.2f}")

    lines = [f"{'figure':<42}{'bf16':>12}{'int8':>12}{'gain':>9}"]
    for r in rows:
        gain = "-" if r["change"] is None else f"{r['change']:+.1%}"
        lines.append(
            f"{r['label']:<42}{fmt(r['bf16']):>12}{fmt(r['int8']):>12}{gain:>9}"
            f"{'  TOO GOOD: check before quoting' if r['too_good'] else ''}"
        )
    for name, s in settings.items():
        lines.append(
            f"{name}: kernel {s.get('kernels') or 'not in the log'}, bench flags {s['figures']['flags']}"
            + (f", error: {s['error']}" if s.get("error") else "")
        )
    return "\n".join(lines)


def not_marlin(setting: dict[str, Any]) -> list[str]:
    """Schemes that ran on another kernel than Marlin (int8 activations exist only there)."""
    return [f"{scheme}: {k}" for scheme, k in (setting.get("kernels") or {}).items() if k != "MarlinLinearKernel"]


def bench(url: str, mode: str, out: Path, *args: str) -> BenchReport | None:
    """One `qwenquant bench MODE URL ...` to `out`; its typed report (None when it wrote none)."""
    r = qwenquant_cli("bench", mode, url, "--out", str(out), *args)
    print(f"  bench {mode} {' '.join(args)}: exit {r.returncode}", file=sys.stderr)
    if r.returncode not in (0, 8):
        print(r.stderr[-2000:], file=sys.stderr)
    return load_report(out) if out.exists() else None


def run_setting(args: argparse.Namespace, setting: str, stem: Path) -> dict[str, Any]:
    """Serve one setting to ready, run the three benches, stop the server."""
    log = stem.with_suffix(".vllm.log")
    cmd = [
        sys.executable,
        "-m",
        "qwenquant",
        "serve",
        str(args.artifact),
        "--profile",
        args.profile,
        "--gpu-mem",
        args.gpu_mem,
        "--activations",
        setting,
        "--log-file",
        str(log),
        "--timeout",
        str(args.timeout),
    ]
    if args.vllm:
        cmd += ["--vllm", args.vllm]
    if args.extra:
        cmd += ["--", *args.extra]
    env = marlin_only(dict(os.environ)) if args.force_marlin else dict(os.environ)
    out: dict[str, Any] = {"setting": setting, "command": cmd, "log": str(log)}
    reports: dict[str, BenchReport | None] = {"run": None, "single": None, "burst": None}
    with serving(cmd, env, out) as url:
        if url is not None:
            print(f"{setting}: ready after {out['ready_s']:.0f} s at {url}", file=sys.stderr)
            reports["run"] = bench(
                url,
                "run",
                stem.with_suffix(".run.json"),
                "--prompts",
                "narrative",
                "--sampling",
                "greedy",
                "--thinking",
                "off",
                "--max-tokens",
                "128",
                "--repeats",
                "2",
                "--max-concurrency",
                str(args.streams),
            )
            reports["single"] = bench(
                url, "depth", stem.with_suffix(".prefill.json"), "--depths", str(args.depth), "--max-tokens", "16"
            )
            reports["burst"] = bench(
                url,
                "depth",
                stem.with_suffix(".burst.json"),
                "--depths",
                str(args.depth),
                "--concurrency",
                str(args.streams),
                "--max-tokens",
                "16",
            )
    out["kernels"] = kernels_of(log)
    run, single, burst = reports["run"], reports["single"], reports["burst"]
    out["figures"] = figures(
        run if isinstance(run, RunReport) else None,
        single if isinstance(single, DepthReport) else None,
        burst if isinstance(burst, DepthReport) else None,
    )
    out["reports"] = {k: str(stem.with_suffix(f".{k if k != 'single' else 'prefill'}.json")) for k in reports}
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("artifact", type=Path)
    ap.add_argument("--settings", default="bf16,int8", help="activation settings, one server each, in this order")
    ap.add_argument("--profile", default="batch")
    ap.add_argument("--gpu-mem", default="24GiB")
    ap.add_argument("--vllm", help="qwenquant-vllm.json, a python or a vllm executable (default: serve's search)")
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--depth", type=int, default=2048)
    ap.add_argument(
        "--force-marlin",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="disable the kernels SM 9.0 prefers to Marlin for every setting (default: on)",
    )
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/activations_bench.json"))
    extra: list[str] = []
    if "--" in argv:
        argv, extra = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    args = ap.parse_args(argv)
    args.extra = extra
    args.out.parent.mkdir(parents=True, exist_ok=True)
    print("Expected" + __doc__.split("Expected", 1)[1].rstrip(), file=sys.stderr)
    report: dict[str, Any] = {
        "artifact": str(args.artifact.resolve()),
        "profile": args.profile,
        "gpu_mem": args.gpu_mem,
        "force_marlin": args.force_marlin,
        "extra": extra,
        "date": time.strftime("%Y-%m-%d"),
        "settings": {},
    }
    for setting in args.settings.split(","):
        stem = args.out.with_name(f"{args.out.stem}-{setting}")
        report["settings"][setting] = run_setting(args, setting, stem)
        args.out.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")  # what is done so far
    s = report["settings"]
    report["rows"] = compare(s.get("bf16", {}).get("figures", {}), s.get("int8", {}).get("figures", {}))
    report["not_marlin"] = {k: not_marlin(v) for k, v in s.items() if not_marlin(v)}
    print(table(report["rows"], s))
    for k, bad in report["not_marlin"].items():
        print(f"{k}: not Marlin ({'; '.join(bad)}): int8 activations did not run there")
    args.out.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    print(f"wrote {args.out}")
    return 0 if all("error" not in v for v in s.values()) and not report["not_marlin"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
