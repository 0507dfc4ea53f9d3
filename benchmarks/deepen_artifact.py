"""Make a deeper copy of a quantized artifact for serving benchmarks: decoder layer i of the copy is
layer i mod N of the original (N its depth), everything else byte-identical.

Why: serving memory and speed depend on shapes, not on the weights' values, and quantizing a
full-depth real-shaped checkpoint (64 layers, 55 GB of bf16 source) costs about 12 minutes of GPU
time, while this takes one pass of file copying. The copy is a benchmark input, never a model to
use: its manifest names the artifact it came from and how it was made (`extra.derived_for_benchmark`),
and `qwenquant verify` checks its files like any other. N must be a multiple of the full-attention
interval (4 on Qwen3.5), so every copied layer keeps its type.

    PYTHONPATH=src python3 -m benchmarks.deepen_artifact artifacts/bench-8 --layers 64 --out artifacts/bench-64
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from qwenquant.checkpoint.config import text_config
from qwenquant.checkpoint.header import INDEX_NAME
from qwenquant.checkpoint.tensorfile import checkpoint_refs, write_checkpoint_tensors
from qwenquant.manifest import MANIFEST_NAME, build_manifest, load_manifest, write_manifest

LAYER = re.compile(r"^(model\.(?:language_model\.)?layers\.)(\d+)\.(.+)$")
MTP_SHARD = "model-mtp.safetensors"
MAX_SHARD_BYTES = 5 * 10**9


def deepen_config(config: dict[str, Any], layers: int) -> dict[str, Any]:
    """config.json for `layers` decoder layers: num_hidden_layers and layer_types repeated."""
    out = json.loads(json.dumps(config))
    tc = out["text_config"] if isinstance(out.get("text_config"), dict) else out  # edited in place
    n = int(tc["num_hidden_layers"])
    types = tc.get("layer_types") or []
    if types:
        if len(types) != n:
            raise SystemExit(f"config has {len(types)} layer_types for {n} layers")
        tc["layer_types"] = [types[i % n] for i in range(layers)]
    tc["num_hidden_layers"] = layers
    if isinstance(out.get("text_config"), dict):
        out["text_config"] = tc
    else:
        out = tc
    return out


def check_depth(config: dict[str, Any], layers: int) -> int:
    """The original depth N; exit when copying layer i mod N would change a layer's type."""
    tc = text_config(config)
    n = int(tc["num_hidden_layers"])
    interval = int(tc.get("full_attention_interval") or 1)
    if layers <= n:
        raise SystemExit(f"--layers {layers} is not deeper than the artifact's {n} layers")
    if n % interval:
        raise SystemExit(f"the artifact's {n} layers are not a multiple of the full-attention interval {interval}")
    return n


def plan_tensors(src: Path, n: int, layers: int) -> tuple[dict[str, Any], dict[str, str]]:
    """Tensor name -> where its bytes live in `src`, for the deeper model; MTP tensors -> their shard."""
    refs = checkpoint_refs(src)
    out: dict[str, Any] = {}
    for name, ref in refs.items():
        m = LAYER.match(name)
        if not m:
            out[name] = ref
            continue
        i = int(m.group(2))
        for j in range(i, layers, n):
            new = f"{m.group(1)}{j}.{m.group(3)}"
            out[new] = dataclasses.replace(ref, name=new)
    separate = {name: MTP_SHARD for name in out if name.startswith("mtp.")}
    return out, separate


def deepen(src: Path, layers: int, out: Path) -> dict[str, Any]:
    """Write the deeper artifact into `out` (built beside it, renamed at the end); return a summary."""
    manifest = load_manifest(src)
    config = json.loads((src / "config.json").read_text())
    n = check_depth(config, layers)
    staging = out.with_name(out.name + ".partial")
    if out.exists():
        raise SystemExit(f"{out} exists; remove it or pass another --out")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    t0 = time.monotonic()
    try:
        tensors, separate = plan_tensors(src, n, layers)
        write_checkpoint_tensors(staging, tensors, MAX_SHARD_BYTES, separate)
        shard_names = {p.name for p in src.glob("*.safetensors")} | {INDEX_NAME, MANIFEST_NAME, "config.json"}
        for f in sorted(src.iterdir()):
            if f.is_file() and f.name not in shard_names:
                shutil.copy2(f, staging / f.name)
        (staging / "config.json").write_text(json.dumps(deepen_config(config, layers), indent=2, sort_keys=True) + "\n")
        derived = {
            "from_root_digest": manifest.root_digest,
            "from_layers": n,
            "layers": layers,
            "rule": "decoder layer i holds the tensors of the original's layer i mod from_layers",
            "purpose": "serving benchmarks (memory, speed); not a model to use",
        }
        new = build_manifest(
            staging,
            source=manifest.source,
            recipe=manifest.recipe,
            recipe_sha256=manifest.recipe_sha256,
            calibration=manifest.calibration,
            stages=manifest.stages,
            quality=manifest.quality,
            tool_versions=manifest.tool_versions,
            extra={**(manifest.extra or {}), "derived_for_benchmark": derived},
        )
        write_manifest(staging, new)
        staging.rename(out)
    except BaseException:  # nothing half-written stays behind, also on Ctrl-C
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return {
        "from": str(src),
        "out": str(out),
        "from_layers": n,
        "layers": layers,
        "tensors": len(tensors),
        "bytes": sum(t.nbytes for t in tensors.values()),
        "seconds": round(time.monotonic() - t0, 1),
        "root_digest": new.root_digest,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("artifact", type=Path, help="a quantized artifact (qwenquant quantize output)")
    p.add_argument("--layers", type=int, required=True, help="decoder layers of the copy, e.g. 64")
    p.add_argument("--out", type=Path, required=True, help="the folder to create")
    a = p.parse_args(argv)
    summary = deepen(a.artifact.resolve(), a.layers, a.out.resolve())
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
