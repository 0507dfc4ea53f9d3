"""Measure the prefill transient of one Gated DeltaNet (linear-attention) layer at the real 27B shape.

vLLM's memory profiling run does not exercise the GDN layers, so the extra memory of their largest
prefill step is not in its KV sizing. This script measures that extra memory on CUDA: the peak
allocated (and reserved) bytes of one GDN layer's prefill forward above what was allocated before it
(weights, the input hidden states, the recurrent-state cache), for

  - one sequence of T tokens (the largest prefill chunk: max_num_batched_tokens), and
  - a burst: T tokens split over N new sequences (N new prompts scheduled in one step).

The forward follows vLLM's prefill path (Qwen3.5 layout): in_proj_qkvz and in_proj_ba, a causal
depthwise conv over q|k|v, l2-normed q and k, fp32 gates, the recurrent states gathered for the
step's sequences, the chunked gated delta rule (final states written back), a gated RMSNorm and
out_proj. Projections are bf16 matmuls (an int4 checkpoint's Marlin/Machete outputs have the same
shapes; the weights themselves are outside the measured transient).

Kernel, first importable (or --kernel):
  vllm   vLLM's own chunk_gated_delta_rule (vllm.third_party.flash_linear_attention.ops, or
         vllm.model_executor.layers.fla.ops in older releases), q/k with 16 heads, v with 48
  fla    flash-linear-attention's fla.ops.gated_delta_rule.chunk_gated_delta_rule (q/k repeated to
         the value heads if the installed release does not take fewer q/k heads)
  torch  transformers' torch_chunk_gated_delta_rule (reference code; a burst runs as a padded batch)

  GPU:  PYTHONPATH=src:/tmp/site python3 -m benchmarks.gdn_transient
  CPU smoke (torch kernel, small): python -m benchmarks.gdn_transient --device cpu --kernel torch \\
            --tokens 128,256 --burst-seqs 1,4 --burst-tokens 256

Prints a table to stdout and writes JSON (--out, default benchmarks/results/gdn_transient.json) with a
linear fit: bytes per token (one sequence) and bytes per extra sequence of a burst.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

CONFIG = Path(__file__).resolve().parent.parent / "src/qwenquant/data/qwen3_8-27b.config.json"
MIB = 1 << 20


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", type=Path, default=CONFIG, help="the model's config.json (text_config is read)")
    p.add_argument("--tokens", default="512,1024,2048,4096,8192", help="one-sequence chunk sizes")
    p.add_argument("--burst-seqs", default="1,8,16,32,64,128,256", help="new sequences in one step")
    p.add_argument("--burst-tokens", default="2048,8192", help="tokens of the burst step (split evenly)")
    p.add_argument("--kernel", choices=("auto", "vllm", "fla", "torch"), default="auto")
    p.add_argument(
        "--state-dtype",
        choices=("float32", "bfloat16", "float16"),
        default="float16",
        help="the recurrent-state cache dtype (vLLM's --mamba-ssm-cache-dtype; the recipes: float16)",
    )
    p.add_argument("--device", default=None, help="default: cuda")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/gdn_transient.json"))
    return p.parse_args(argv)


def gdn_dims(config_path: Path) -> dict[str, int]:
    cfg = json.loads(config_path.read_text())
    t = cfg.get("text_config", cfg)
    return {
        "hidden": t["hidden_size"],
        "k_heads": t["linear_num_key_heads"],
        "v_heads": t["linear_num_value_heads"],
        "k_dim": t["linear_key_head_dim"],
        "v_dim": t["linear_value_head_dim"],
        "conv": t["linear_conv_kernel_dim"],
    }


def load_kernel(choice: str, d: dict[str, int], dev: torch.device) -> tuple[str, Any]:
    """(name, fn): fn(q, k, v, g, beta, initial_state, cu_seqlens) -> (o [1,T,Hv,V], final_state).

    Each candidate is imported and run once on 128 tokens in two sequences; the first that works is used.
    """
    order = ("vllm", "fla", "torch") if choice == "auto" else (choice,)
    errors = []
    for name in order:
        try:
            fn = _KERNELS[name]()
            probe(fn, d, dev)
            return name, fn
        except Exception as exc:  # any failure of a candidate moves on to the next
            errors.append(f"{name}: {type(exc).__name__}: {exc}")
            print(f"kernel {name} not usable: {errors[-1]}", file=sys.stderr)
    sys.exit("no GDN kernel usable: " + "; ".join(errors))


def probe(fn: Any, d: dict[str, int], dev: torch.device) -> None:
    t, bf = 128, {"dtype": torch.bfloat16, "device": dev}
    q = F.normalize(torch.randn(1, t, d["k_heads"], d["k_dim"], **bf), dim=-1)
    k = F.normalize(torch.randn(1, t, d["k_heads"], d["k_dim"], **bf), dim=-1)
    v = torch.randn(1, t, d["v_heads"], d["v_dim"], **bf)
    g = -torch.rand(1, t, d["v_heads"], device=dev)
    beta = torch.rand(1, t, d["v_heads"], device=dev)
    state = torch.zeros(2, d["v_heads"], d["v_dim"], d["k_dim"], device=dev)
    cu = torch.tensor([0, 64, 128], dtype=torch.int32, device=dev)
    with torch.inference_mode():
        o, _ = fn(q, k, v, g, beta, state, cu)
    if tuple(o.shape[-3:]) != (t, d["v_heads"], d["v_dim"]):
        raise ValueError(f"output shape {tuple(o.shape)}")


def _vllm_kernel() -> Any:
    try:
        from vllm.third_party.flash_linear_attention.ops import chunk_gated_delta_rule as fn
    except ImportError:
        from vllm.model_executor.layers.fla.ops import chunk_gated_delta_rule as fn

    import inspect

    takes = set(inspect.signature(fn).parameters)  # older releases: no use_qk_l2norm_in_kernel

    def run(q, k, v, g, beta, state, cu):
        kw = {
            "q": q,
            "k": k,
            "v": v,
            "g": g,
            "beta": beta,
            "initial_state": state,
            "output_final_state": True,
            "cu_seqlens": cu,
            "use_qk_l2norm_in_kernel": False,
        }
        return fn(**{key: val for key, val in kw.items() if key in takes})

    return run


def _fla_kernel() -> Any:
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fn

    def run(q, k, v, g, beta, state, cu):
        try:
            return fn(q=q, k=k, v=v, g=g, beta=beta, initial_state=state, output_final_state=True, cu_seqlens=cu)
        except (AssertionError, ValueError, RuntimeError):
            rep = v.shape[2] // q.shape[2]  # an fla without grouped q/k heads: repeat them (more memory)
            q2, k2 = q.repeat_interleave(rep, dim=2), k.repeat_interleave(rep, dim=2)
            return fn(q=q2, k=k2, v=v, g=g, beta=beta, initial_state=state, output_final_state=True, cu_seqlens=cu)

    return run


def _torch_kernel() -> Any:
    try:
        from transformers.models.qwen3_5.modeling_qwen3_5 import torch_chunk_gated_delta_rule as fn
    except ImportError:
        from transformers.models.qwen3_next.modeling_qwen3_next import torch_chunk_gated_delta_rule as fn

    def run(q, k, v, g, beta, state, cu):
        n = len(cu) - 1  # equal split: the burst runs as a batch of n sequences
        rep = v.shape[2] // q.shape[2]
        q, k = q.repeat_interleave(rep, dim=2), k.repeat_interleave(rep, dim=2)
        q, k, v = (x.reshape(n, -1, *x.shape[2:]) for x in (q, k, v))
        g, beta = (x.reshape(n, -1, x.shape[2]) for x in (g, beta))
        o, final = fn(
            q, k, v, g=g, beta=beta, initial_state=state, output_final_state=True, use_qk_l2norm_in_kernel=False
        )
        return o.reshape(1, -1, *o.shape[2:]), final

    return run


_KERNELS = {"vllm": _vllm_kernel, "fla": _fla_kernel, "torch": _torch_kernel}


class Layer:
    """One GDN layer's weights (bf16, random) and the recurrent-state cache for `slots` sequences."""

    def __init__(self, d: dict[str, int], slots: int, state_dtype: torch.dtype, dev: torch.device) -> None:
        self.d = d
        self.key_dim, self.value_dim = d["k_heads"] * d["k_dim"], d["v_heads"] * d["v_dim"]
        qkv = 2 * self.key_dim + self.value_dim
        bf = {"dtype": torch.bfloat16, "device": dev}
        self.w_qkvz = torch.randn(qkv + self.value_dim, d["hidden"], **bf) * d["hidden"] ** -0.5
        self.w_ba = torch.randn(2 * d["v_heads"], d["hidden"], **bf) * d["hidden"] ** -0.5
        self.w_conv = torch.randn(qkv, 1, d["conv"], **bf) * 0.5
        self.w_out = torch.randn(d["hidden"], self.value_dim, **bf) * self.value_dim**-0.5
        self.norm = torch.ones(d["v_dim"], **bf)
        self.a_log = torch.zeros(d["v_heads"], device=dev)
        self.dt_bias = torch.zeros(d["v_heads"], device=dev)
        self.state = torch.zeros(slots, d["v_heads"], d["v_dim"], d["k_dim"], dtype=state_dtype, device=dev)

    def forward(self, x: torch.Tensor, cu: torch.Tensor, kernel: Any) -> torch.Tensor:
        d, n_tok, n_seq = self.d, x.shape[0], len(cu) - 1
        qkvz = x @ self.w_qkvz.t()
        ba = x @ self.w_ba.t()
        mixed, z = qkvz.split([2 * self.key_dim + self.value_dim, self.value_dim], dim=-1)
        conv = causal_conv(mixed, self.w_conv, cu)
        q, k, v = conv.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q = F.normalize(q.reshape(1, n_tok, d["k_heads"], d["k_dim"]).float(), dim=-1).to(x.dtype)
        k = F.normalize(k.reshape(1, n_tok, d["k_heads"], d["k_dim"]).float(), dim=-1).to(x.dtype)
        v = v.reshape(1, n_tok, d["v_heads"], d["v_dim"]).contiguous()
        del conv
        b, a = ba.split([d["v_heads"], d["v_heads"]], dim=-1)
        beta = b.float().sigmoid().unsqueeze(0)
        g = (-self.a_log.exp() * F.softplus(a.float() + self.dt_bias)).unsqueeze(0)
        idx = torch.arange(n_seq, device=x.device)
        init = self.state[idx]  # vLLM gathers the step's states (cache dtype), then zeroes new sequences
        init.zero_()
        o, final = kernel(q, k, v, g, beta, init, cu)
        self.state[idx] = final.to(self.state.dtype)
        del q, k, v, g, beta, init, final
        o = o.reshape(n_tok, d["v_heads"], d["v_dim"])
        zz = z.reshape(n_tok, d["v_heads"], d["v_dim"])
        normed = (o.float() * torch.rsqrt(o.float().pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype)
        gated = normed * self.norm * F.silu(zz)
        return gated.reshape(n_tok, self.value_dim) @ self.w_out.t()


def causal_conv(mixed: torch.Tensor, weight: torch.Tensor, cu: torch.Tensor) -> torch.Tensor:
    """Depthwise causal conv + SiLU per sequence of the packed step ([T, C] -> [T, C])."""
    out = torch.empty_like(mixed)
    width = weight.shape[-1]
    bounds = cu.tolist()
    for start, end in zip(bounds[:-1], bounds[1:], strict=False):
        seg = mixed[start:end].t().unsqueeze(0)
        y = F.conv1d(F.pad(seg, (width - 1, 0)), weight, groups=weight.shape[0])
        out[start:end] = F.silu(y[0].t())
    return out


def measure(layer: Layer, kernel: Any, n_tok: int, n_seq: int, dev: torch.device) -> dict[str, Any]:
    per = n_tok // n_seq
    cu = torch.arange(0, n_seq + 1, device=dev, dtype=torch.int32) * per
    x = torch.randn(per * n_seq, layer.d["hidden"], dtype=torch.bfloat16, device=dev)
    layer.forward(x, cu, kernel)  # warm-up: Triton autotuning allocates memory of its own
    sync(dev)
    if dev.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
        base, base_res = torch.cuda.memory_allocated(dev), torch.cuda.memory_reserved(dev)
    t0 = time.perf_counter()
    out = layer.forward(x, cu, kernel)
    sync(dev)
    ms = (time.perf_counter() - t0) * 1e3
    row: dict[str, Any] = {"tokens": per * n_seq, "seqs": n_seq, "ms": round(ms, 2), "out_mib": out.numel() * 2 / MIB}
    if dev.type == "cuda":
        row["peak_extra_mib"] = (torch.cuda.max_memory_allocated(dev) - base) / MIB
        row["reserved_extra_mib"] = (torch.cuda.max_memory_reserved(dev) - base_res) / MIB
    del out, x
    return row


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares y = a + b x; (a, b)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    return my - b * mx, b


def summarize(single: list[dict], bursts: list[dict]) -> dict[str, Any]:
    key = "peak_extra_mib" if single and "peak_extra_mib" in single[0] else None
    if key is None:
        return {}
    out: dict[str, Any] = {}
    if len(single) > 1:
        a, b = fit([r["tokens"] for r in single], [r[key] for r in single])
        out["single"] = {"const_mib": round(a, 2), "bytes_per_token": round(b * MIB)}
    per_seq = []
    for t in sorted({r["tokens"] for r in bursts}):
        rows = [r for r in bursts if r["tokens"] == t]
        if len(rows) > 1:
            a, b = fit([r["seqs"] for r in rows], [r[key] for r in rows])
            per_seq.append({"tokens": t, "const_mib": round(a, 2), "bytes_per_seq": round(b * MIB)})
    if per_seq:
        out["burst"] = per_seq
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    dev = torch.device(args.device or "cuda")
    torch.manual_seed(args.seed)
    d = gdn_dims(args.config)
    tokens = [int(t) for t in args.tokens.split(",")]
    seqs = [int(s) for s in args.burst_seqs.split(",")]
    burst_tokens = [int(t) for t in args.burst_tokens.split(",")]
    name, kernel = load_kernel(args.kernel, d, dev)
    layer = Layer(d, max(seqs), getattr(torch, args.state_dtype), dev)
    print(f"device {dev}; kernel {name}; GDN {d}; state {args.state_dtype}", file=sys.stderr)
    with torch.inference_mode():
        single = [measure(layer, kernel, t, 1, dev) for t in tokens]
        bursts = [measure(layer, kernel, t, n, dev) for t in burst_tokens for n in seqs if n <= t]
    print(table(single + bursts))
    result = {
        "bench": "gdn_transient",
        "kernel": name,
        "dims": d,
        "state_dtype": args.state_dtype,
        "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.machine(),
        "torch": torch.__version__,
        "versions": versions(),
        "single": single,
        "burst": bursts,
        "fit": summarize(single, bursts),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["fit"]), file=sys.stderr)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


def table(rows: list[dict]) -> str:
    lines = [f"{'tokens':>7} {'seqs':>5} {'peak extra MiB':>15} {'reserved MiB':>13} {'MiB/1K tok':>11} {'ms':>8}"]
    for r in rows:
        peak, res = r.get("peak_extra_mib", math.nan), r.get("reserved_extra_mib", math.nan)
        lines.append(
            f"{r['tokens']:>7} {r['seqs']:>5} {peak:>15.1f} {res:>13.1f} "
            f"{peak / r['tokens'] * 1024:>11.2f} {r['ms']:>8.2f}"
        )
    return "\n".join(lines)


def versions() -> dict[str, str]:
    from importlib import metadata

    out = {}
    for dist in ("vllm", "flash-linear-attention", "fla-core", "transformers", "triton"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return out


if __name__ == "__main__":
    raise SystemExit(main())
