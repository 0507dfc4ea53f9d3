"""`qwenquant serve --gpu-mem 24GiB` on a CUDA GPU: the memory plan beside vLLM's own figures.

For each serve profile: start `qwenquant serve ARTIFACT --profile P --gpu-mem 24GiB --vllm LAUNCHER`,
wait for `ready`, send one greedy and one sampled completion, stop it (SIGTERM), read vLLM's log for
its figures and print a plan-vs-vLLM table with % differences; write JSON.

vLLM's log lines read (vLLM 0.26 .. 0.33, v1 engine):
  "Model loading took 5.4 GiB memory and 12.3 seconds"                  weights loaded
  "Available KV cache memory: 15.5 GiB"                                 KV + GDN state pool
  "GPU KV cache size: 1,226,351 tokens"                                 KV tokens
  "Maximum concurrency for 32,768 tokens per request: 37.43x"
  "Graph capturing finished in 31 secs, took 0.45 GiB"                  CUDA graph memory
  "CUDA graph pool memory: 0.44 GiB (actual), 0.5 GiB (estimated), ..." (newer releases)
  "... torch peak memory increase: 7.36GiB; ..."                        peak activation (DEBUG)
  "init engine (profile, create kv cache, warmup model) took 256.80 s"  (0.26 says "seconds")
The peak-activation line is logged at DEBUG, so the server runs with VLLM_LOGGING_LEVEL=DEBUG.

  python -m benchmarks.serve_cuda_bench ARTIFACT --vllm .venv-vllm/qwenquant-vllm.json [--gpu-mem 24GiB]
      [--gpu-mem-soft] [--profile single-user --profile batch] [--gpus N [--split tensor|pipeline]]
      [--out benchmarks/results/serve_cuda_bench.json] [-- vLLM flags]

`--gpu-mem` is serve's hard limit (a ballast holds the rest of the GPU) unless --gpu-mem-soft.

With `--gpus N` the server runs over N GPUs (`qwenquant serve --gpus N --split S`; without
`--split` serve picks from the GPUs' link) and the plan's figures are per GPU (`qwenquant plan
--gpus N --split S`; under pipeline parallelism the stage that limits), as vLLM logs them per worker.

Expected (written before the run): KV memory, KV tokens and concurrency within 5% of the plan
(about 1% was seen at 8 layers); weights within 5% (the plan counts tensor bytes, vLLM measures the
allocator); activations and CUDA graphs are the plan's estimates and may differ more. Too good to
believe: weights or KV memory equal to the plan to the byte, or an engine start under 30 s at 64 layers.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.serving import served_model, serving

GiB = 1024**3
_NUM = r"([0-9][0-9,]*(?:\.[0-9]+)?)"
PATTERNS = {
    "weights_gib": rf"Model loading took {_NUM} ?GiB",
    "weights_load_s": rf"Model loading took {_NUM} ?GiB(?: memory)? and {_NUM} s",
    "kv_available_gib": rf"Available KV cache memory: {_NUM} ?GiB",
    "kv_tokens": rf"KV cache size: {_NUM} tokens",
    "max_concurrency": rf"Maximum concurrency for {_NUM} tokens(?: per request)?: {_NUM}x",
    "cuda_graph_gib": rf"Graph capturing finished in {_NUM} secs?, took {_NUM} ?GiB",
    "cuda_graph_pool_gib": rf"CUDA graph pool memory: {_NUM} ?GiB \(actual\)",
    "cuda_graph_estimate_gib": rf"Estimated CUDA graph memory: {_NUM} ?GiB",
    "peak_activation_gib": rf"torch peak memory increase: {_NUM} ?GiB",
    "non_kv_gib": rf"Total non KV cache memory: {_NUM} ?GiB",
    "engine_init_s": rf"init engine \(profile, create kv cache, warmup model\) took {_NUM} s",
}
_LAST_GROUP = {"weights_load_s", "max_concurrency", "cuda_graph_gib"}  # the figure is the 2nd number


def _num(text: str) -> float:
    return float(text.replace(",", ""))


def parse_vllm_log(text: str) -> dict[str, float]:
    """vLLM's own figures from its log (the last occurrence of each); absent lines are left out."""
    out: dict[str, float] = {}
    for key, pattern in PATTERNS.items():
        matches = list(re.finditer(pattern, text))
        if matches:
            m = matches[-1]
            out[key] = _num(m.group(m.lastindex if key in _LAST_GROUP else 1))
            if key == "max_concurrency":
                out["max_concurrency_len"] = _num(m.group(1))
    if "cuda_graph_gib" not in out and "cuda_graph_pool_gib" in out:
        out["cuda_graph_gib"] = out["cuda_graph_pool_gib"]
    return out


def plan_figures(budget: Any) -> dict[str, float]:
    """The plan's figures in the units vLLM logs (GiB, tokens, sequences)."""
    from qwenquant.plan.budget import RUNTIME_OVERHEAD_BYTES

    concurrency = max(budget.cache_available, 0) / budget.seq_bytes
    return {
        "weights_gib": budget.weights_bytes / GiB,
        "kv_available_gib": budget.cache_available / GiB,
        # vLLM's "KV cache size: N tokens" is its maximum concurrency x max_model_len
        # (get_kv_cache_capacity), not a count of cached token slots
        "kv_tokens": int(concurrency * budget.max_model_len),
        "max_concurrency": concurrency,
        "peak_activation_gib": budget.activation_bytes / GiB,
        "cuda_graph_gib": (budget.runtime_bytes - RUNTIME_OVERHEAD_BYTES) / GiB,
    }


def compare(plan: dict[str, float], vllm: dict[str, float]) -> list[dict[str, Any]]:
    """Rows of (figure, plan, vLLM, % difference of the plan from vLLM); >5% is flagged."""
    rows = []
    for key in (
        "weights_gib",
        "kv_available_gib",
        "kv_tokens",
        "max_concurrency",
        "peak_activation_gib",
        "cuda_graph_gib",
        "engine_init_s",
    ):
        p, v = plan.get(key), vllm.get(key)
        diff = (p - v) / v * 100 if p is not None and v else None
        rows.append({"figure": key, "plan": p, "vllm": v, "diff_pct": diff, "flag": diff is not None and abs(diff) > 5})
    return rows


def table(profile: str, rows: list[dict[str, Any]]) -> str:
    def fmt(x: float | None) -> str:
        return "-" if x is None else (f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.2f}")

    lines = [f"profile {profile}", f"  {'figure':<22}{'plan':>14}{'vLLM':>14}{'diff':>10}"]
    for r in rows:
        d = "-" if r["diff_pct"] is None else f"{r['diff_pct']:+.1f}%"
        lines.append(
            f"  {r['figure']:<22}{fmt(r['plan']):>14}{fmt(r['vllm']):>14}{d:>10}{'  > 5%' if r['flag'] else ''}"
        )
    return "\n".join(lines)


def _complete(url: str, model: str, temperature: float) -> dict[str, Any]:
    from qwenquant.net.http import post_json

    body = {
        "model": model,
        "prompt": "The capital of France is",
        "max_tokens": 32,
        "temperature": temperature,
        "seed": 1234,
    }
    t0 = time.monotonic()
    answer = post_json(url + "/v1/completions", body, timeout=300)
    return {
        "temperature": temperature,
        "text": answer["choices"][0]["text"],
        "seconds": time.monotonic() - t0,
        "usage": answer.get("usage"),
    }


def run_profile(args: argparse.Namespace, profile: str, log_path: Path) -> dict[str, Any]:
    """Serve one profile to ready, ask two completions, stop; vLLM's figures and the answers."""
    from qwenquant.net.ports import free_port

    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "qwenquant",
        "serve",
        str(args.artifact),
        "--profile",
        profile,
        "--gpu-mem",
        args.gpu_mem,
        "--port",
        str(port),
        "--log-file",
        str(log_path),
        "--timeout",
        str(args.timeout),
        "--gpus",
        str(args.gpus),
    ] + (["--split", args.split] if args.split else [])
    if args.vllm:
        cmd += ["--vllm", args.vllm]
    if args.gpu_mem_soft:
        cmd += ["--gpu-mem-soft"]
    if args.extra:
        cmd += ["--", *args.extra]
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "DEBUG"}
    result: dict[str, Any] = {"profile": profile, "command": cmd, "log": str(log_path)}
    with serving(cmd, env, result) as url:
        if url is None:
            return result
        from qwenquant.bench.metrics import acceptance, scrape
        from qwenquant.net.prometheus import spec_counters

        model = served_model(url)
        before = spec_counters(scrape(url) or "")
        result["completions"] = [_complete(url, model, 0.0), _complete(url, model, 0.8)]
        result["mtp"] = acceptance(spec_counters(scrape(url) or "").minus(before))
    result["vllm"] = parse_vllm_log(log_path.read_text(errors="replace")) if log_path.exists() else {}
    return result


def machine(vllm: str | None) -> dict[str, Any]:
    """GPU names (nvidia-smi), the artifact-independent facts a reader needs, and the vLLM version."""
    out: dict[str, Any] = {}
    try:
        r = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,name,memory.total,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        out["gpus"] = r.stdout.strip().splitlines()
    except OSError as e:
        out["gpus"] = f"nvidia-smi: {e}"
    if vllm and vllm.endswith(".json") and Path(vllm).exists():
        out["vllm_install"] = json.loads(Path(vllm).read_text())
    out["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("artifact", type=Path)
    ap.add_argument("--vllm", help="qwenquant-vllm.json, a python or a vllm executable (default: serve's search)")
    ap.add_argument("--gpu-mem", default="24GiB")
    ap.add_argument("--gpu-mem-soft", action="store_true", help="the budget alone, no ballast (serve --gpu-mem-soft)")
    ap.add_argument("--profile", action="append", default=[])
    ap.add_argument("--gpus", type=int, default=1, help="N GPUs; plan figures per GPU")
    ap.add_argument(
        "--split",
        choices=("tensor", "pipeline"),
        help="serve --split (default: from the GPUs' link); the plan assumes tensor unless pipeline is given",
    )
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/serve_cuda_bench.json"))
    ap.add_argument("extra", nargs="*", help="vLLM flags after --")
    extra: list[str] = []
    if "--" in argv:  # vLLM flags after `--` (argparse would read them as its own options)
        argv, extra = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    args = ap.parse_args(argv)
    args.extra = [*args.extra, *extra]
    from qwenquant.plan.artifact import make_plan
    from qwenquant.plan.gpumem import parse_size

    profiles = args.profile or ["single-user", "batch"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "artifact": str(args.artifact.resolve()),
        "gpu_mem": args.gpu_mem,
        "gpus": args.gpus,
        "split": args.split,
        "gpu_mem_limit": "soft" if args.gpu_mem_soft else "hard",
        "date": time.strftime("%Y-%m-%d"),
        "extra": args.extra,
        "machine": machine(args.vllm),
        "profiles": {},
    }
    print("Expected" + __doc__.split("Expected", 1)[1].rstrip(), file=sys.stderr)
    for profile in profiles:
        pp = args.gpus if args.split == "pipeline" else 1
        plan = make_plan(
            args.artifact, parse_size(args.gpu_mem), profiles=[profile], tp=args.gpus // pp, pp=pp
        ).budgets[profile]
        res = run_profile(args, profile, args.out.with_name(f"{args.out.stem}-{profile}.log"))
        vllm = dict(res.get("vllm", {}))
        res["plan"] = plan_figures(plan)
        res["rows"] = compare(res["plan"], vllm)
        report["profiles"][profile] = res
        print(table(profile, res["rows"]))
        for c in res.get("completions", []):
            print(f"  T={c['temperature']}: {c['text']!r} ({c['seconds']:.1f} s)")
        if res.get("mtp", {}).get("speculative"):
            m = res["mtp"]
            print(
                f"  MTP: mean acceptance length {m['mean_acceptance_length']:.3f} over {m['drafts']:.0f} drafts, "
                f"per position {[round(x, 3) for x in m['per_position']]}"
            )
        if "ready_s" in res:
            print(f"  ready after {res['ready_s']:.1f} s")
        if "error" in res:
            print(f"  error: {res['error']}")
    args.out.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    print(f"wrote {args.out}")
    return 0 if all("error" not in r for r in report["profiles"].values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
