"""Projections for benchmarks/quantize_arms.py: 64 layers on the measured GPU, and an RTX 3090 from a
per-phase model. Pure functions over the arms' JSON; every figure names its basis.

The per-phase model splits a decoder layer's measured phases by the resource that bounds them:
  - bf16 tensor-core work: the two layer forwards per sample (the rest of `calibrate`, and `forward`),
    and on the tensor-core Hessian path the Hessian products; FLOPs counted from the checkpoint's
    Linear shapes (2 x out x in per token) and Hessian widths (2 x in^2 per token, once per shared input);
  - float32 work: the fp32 Hessian path and the GPTQ solve (`gptq`: Cholesky, column sweeps);
  - host-bound work (read, build, write, rebuild, the stages outside the loop): kept at the measured
    seconds (the host, disk and PCIe decide them, not the GPU), H2D bytes at PCIe 4.0 x16 as a floor.
Each GPU-bound part keeps the efficiency (achieved / datasheet peak) the measured GPU showed and is
re-timed at the target's datasheet peak. Datasheet peaks (dense, no sparsity):
"""

from __future__ import annotations

import re
from typing import Any

PEAKS = {  # FLOP/s and bytes/s
    "H200": {"bf16_tc": 989e12, "fp32": 67e12, "hbm": 4.8e12},
    "RTX 3090": {"bf16_tc": 71e12, "fp32": 35.6e12, "hbm": 936e9},
}
PCIE4_BYTES_S = 25e9  # practical host-to-device rate of PCIe 4.0 x16 (the 3090's bus)
REAL_LAYERS = 64
# Linears fed the very same input share one Hessian (engine/quantize.LayerGPTQ)
SHARED = (("in_proj_qkv", "in_proj_z"), ("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
LAYER = re.compile(r"^model\.language_model\.layers\.(\d+)\.(.+)\.weight$")


def layer_shapes(refs: dict[str, Any], ignore_match: Any) -> dict[int, dict[str, tuple[int, int]]]:
    """Layer -> module -> (out, in) of every 2-D weight; modules the recipe ignores get a '!' prefix."""
    out: dict[int, dict[str, tuple[int, int]]] = {}
    for name, ref in refs.items():
        m = LAYER.match(name)
        if m and len(ref.shape) == 2:
            mod = name[: -len(".weight")]
            key = m.group(2) if not ignore_match(mod) else "!" + m.group(2)
            out.setdefault(int(m.group(1)), {})[key] = (int(ref.shape[0]), int(ref.shape[1]))
    return out


def layer_flops(mods: dict[str, tuple[int, int]], tokens: int) -> dict[str, float]:
    """One layer over `tokens` calibration tokens: a forward's Linear FLOPs, the Hessian FLOPs
    (shared inputs once), and the GPTQ sweep's FLOPs (about 2 x out x in^2 per quantized module)."""
    fwd = sum(2.0 * o * i for o, i in mods.values()) * tokens
    seen: set[str] = set()
    hess = 0.0
    for key, (_o, i) in mods.items():
        if key.startswith("!"):
            continue
        leaf = key.rsplit(".", 1)[-1]
        group = next((g for g in SHARED if leaf in g), (leaf,))
        gid = key.rsplit(".", 1)[0] + ":" + "/".join(group)
        if gid not in seen:
            seen.add(gid)
            hess += 2.0 * i * i * tokens
    solve = sum(2.0 * o * i * i for k, (o, i) in mods.items() if not k.startswith("!"))
    return {"forward_flops": fwd, "hessian_flops": hess, "solve_flops": solve}


def split_layer(phases: dict[str, float], flops: dict[str, float], hessian_rate: float) -> dict[str, float]:
    """A layer's measured phases as (forward work, Hessian work, solve work, host work) seconds;
    the Hessian's share of `calibrate` is its FLOPs at the rate measured for its path."""
    hess = min(phases.get("calibrate", 0.0), flops["hessian_flops"] / hessian_rate)
    host = sum(phases.get(k, 0.0) for k in ("read", "build", "write", "rebuild"))
    return {
        "forward": phases.get("calibrate", 0.0) - hess + phases.get("forward", 0.0),
        "hessian": hess,
        "solve": phases.get("gptq", 0.0),
        "host": host,
    }


def layer_on(
    target: str,
    split: dict[str, float],
    flops: dict[str, float],
    precision: str,
    layer_bytes: float,
    measured_on: str = "H200",
) -> dict[str, float]:
    """One layer's seconds on `target`: each GPU part at the efficiency it showed on `measured_on`."""
    src, dst = PEAKS[measured_on], PEAKS[target]
    hkind = "bf16_tc" if precision == "tensor-core" else "fp32"
    out = {
        "forward": split["forward"] * src["bf16_tc"] / dst["bf16_tc"],
        "hessian": split["hessian"] * src[hkind] / dst[hkind],
        "solve": split["solve"] * src["fp32"] / dst["fp32"],
        "host": max(split["host"], layer_bytes / PCIE4_BYTES_S),
    }
    out["total"] = sum(out.values())
    return out


def efficiencies(split: dict[str, float], flops: dict[str, float], precision: str) -> dict[str, float | None]:
    """Achieved / H200 datasheet peak for each GPU part of a layer (what the projection carries over)."""
    p = PEAKS["H200"]
    hkind = "bf16_tc" if precision == "tensor-core" else "fp32"

    def eff(work: float, secs: float, peak: float) -> float | None:
        return work / secs / peak if secs > 0 else None

    return {
        "forward_bf16": eff(2 * flops["forward_flops"], split["forward"], p["bf16_tc"]),
        "hessian_" + hkind: eff(flops["hessian_flops"], split["hessian"], p[hkind]),
        "solve_fp32": eff(flops["solve_flops"], split["solve"], p["fp32"]),
    }


def real_types() -> list[str]:
    return ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(REAL_LAYERS)]


def per_type_mean(values: dict[int, float], types: list[str]) -> dict[str, float]:
    """Mean per layer type, layer 0 left out when another layer of its type was measured."""
    by: dict[str, list[float]] = {}
    for i, v in values.items():
        if i == 0 and sum(1 for j in values if types[j] == types[0]) > 1:
            continue
        by.setdefault(types[i], []).append(v)
    return {k: sum(v) / len(v) for k, v in by.items()}


def project_qwenquant(arm: dict[str, Any], bytes_ratio: float) -> dict[str, Any]:
    """64 layers of the qwenquant arm on the measured GPU. One-time costs (layer 0's excess over a
    steady layer: what the untimed warm-up did not catch) count once; stages that read or write
    the whole checkpoint scale with its bytes; the lm_head, MTP and calibration stages do not
    depend on depth."""
    types = arm["layer_types"]
    secs = {r["layer"]: r["seconds"] for r in arm["gptq_layers"]}
    per = per_type_mean(secs, types)
    layers = sum(per[t] for t in real_types())
    st = {s["stage"]: s["seconds"] for s in arm["stages"]}
    excess0 = max(0.0, secs[0] - per[types[0]]) if secs else 0.0
    loop = sum(secs.values())
    gptq_after = st["gptq"] - loop  # after the loop: head calibration, links, config, identity proof
    scaled = {k: st[k] * bytes_ratio for k in ("source", "textonly", "check", "manifest") if k in st}
    fixed = {k: st[k] for k in ("calibration", "lm_head", "mtp", "eval") if k in st}
    parts = {
        "layers": layers,
        "layer0_one_time": excess0,
        **gptq_tail_parts(arm.get("gptq_tail"), gptq_after, bytes_ratio, REAL_LAYERS / max(1, len(secs))),
        **{f"{k} (x bytes)": v for k, v in scaled.items()},
        **{f"{k} (fixed)": v for k, v in fixed.items()},
    }
    return {"per_layer_seconds": per, "parts": parts, "total_seconds": sum(parts.values())}


# the gptq stage after its loop, each part by what it depends on: the head calibration (final norm,
# lm_head Hessian, held-out states; the MTP head's GPTQ) on the tokens and the hidden size; the
# tensors outside the decoder layers (embeddings, lm_head, vision tower, written into the stage
# folder) are the same at any depth; one hard link per layer file
TAIL_FIXED = ("head_calibration", "mtp_gptq", "rest_shards", "index_and_calibration")
TAIL_PER_LAYER = ("layer_links",)


def gptq_tail_parts(
    tail: dict[str, float] | None, after_loop: float, bytes_ratio: float, layers_ratio: float
) -> dict[str, float]:
    """The gptq stage's time after its loop at 64 layers. Without the engine's split (`tail`, from
    runs before it was logged) all of it scales with the checkpoint's bytes. With it: the fixed
    parts as measured, the links per layer, and the rest (identity proof, config, the stage
    record's hashing, anything not logged) with the bytes: an upper bound, since the run's digest
    cache already holds the layer files' digests."""
    if not tail:
        return {"gptq_after_loop (x bytes)": after_loop * bytes_ratio}
    fixed = sum(tail.get(k, 0.0) for k in TAIL_FIXED)
    per_layer = sum(tail.get(k, 0.0) for k in TAIL_PER_LAYER)
    rest = max(0.0, after_loop - fixed - per_layer)
    return {
        "gptq_after_loop (fixed)": fixed,
        "gptq_after_loop (x layers)": per_layer * layers_ratio,
        "gptq_after_loop (x bytes)": rest * bytes_ratio,
    }


def project_oneshot(arm: dict[str, Any], bytes_ratio: float) -> dict[str, Any]:
    """64 layers of oneshot + save: per layer type (its layer timing) x 48 + 16, layer 0's excess
    once, the model load and the save scaled with the checkpoint's bytes."""
    types = arm["layer_types"]
    secs = dict(enumerate(arm["per_layer_seconds"]))
    per = per_type_mean(secs, types)
    if set(per) != set(real_types()):
        return {"skipped": "fewer than 4 layers timed"}
    layers = sum(per[t] for t in real_types())
    # layer k's time runs from its first calibration call to layer k+1's: the last layer is not timed
    # apart, so what oneshot spent outside the timed layers less one steady last layer is its setup
    # (dataset, tracing) and tail, paid once; so is layer 0's excess over a steady layer of its type
    tail = arm["oneshot_seconds"] - sum(secs.values()) - per[types[len(secs)]]
    excess0 = max(0.0, secs[0] - per[types[0]])
    parts = {
        "layers": layers,
        "layer0_one_time": excess0,
        "setup_and_tail_once": max(0.0, tail),
        "load (x bytes)": arm["load_seconds"] * bytes_ratio,
        "save (x bytes)": arm["save_seconds"] * bytes_ratio,
    }
    return {"per_layer_seconds": per, "parts": parts, "total_seconds": sum(parts.values())}


def project_3090(arm: dict[str, Any], real_bytes: float, bytes_ratio: float) -> dict[str, Any]:
    """The qwenquant arm on an RTX 3090 by the per-phase model (module docstring): per layer type,
    the median phase split re-timed at the 3090's peaks; the lm_head GPTQ as float32 work; the
    stages outside the loop as measured (host-bound) and scaled like the 64-layer projection."""
    types, precision = arm["layer_types"], arm["hessian_precision"]
    rate = arm["hessian_rates"][precision]
    lay_bytes = real_bytes / REAL_LAYERS
    out_types: dict[str, Any] = {}
    for kind in set(types):
        rows = [(i, ph) for i, ph in enumerate(arm["gptq_layer_phases"]) if types[i] == kind and i > 0] or [
            (i, ph) for i, ph in enumerate(arm["gptq_layer_phases"]) if types[i] == kind
        ]
        i, ph = rows[len(rows) // 2]
        flops = arm["layer_flops"][str(i)]
        split = split_layer(ph, flops, rate)
        out_types[kind] = {
            "h200_split": split,
            "efficiency": efficiencies(split, flops, precision),
            "rtx3090": layer_on("RTX 3090", split, flops, precision, lay_bytes),
        }
    if set(out_types) != set(real_types()):
        return {"skipped": "a layer type was not measured"}
    layers = sum(out_types[t]["rtx3090"]["total"] for t in real_types())
    q = project_qwenquant(arm, bytes_ratio)["parts"]
    head = arm["lm_head_timing"]
    fp = PEAKS["H200"]["fp32"] / PEAKS["RTX 3090"]["fp32"]
    head_s = head["rows_gptq_seconds"] * fp + head["before_rows_seconds"] + head["after_rows_seconds"]
    other = sum(v for k, v in q.items() if k not in ("layers", "lm_head (fixed)"))
    return {
        "per_type": out_types,
        "layers_seconds": layers,
        "lm_head_seconds": head_s,
        "outside_loop_seconds": other,
        "total_seconds": layers + head_s + other,
        "basis": "per-phase model (benchmarks/phase_model.py): H200 efficiencies at the 3090's datasheet peaks "
        "(bf16 tensor cores 71 TFLOP/s dense, float32 35.6 TFLOP/s, 936 GB/s); host-bound parts "
        "as measured; not measured on a 3090",
    }
