"""The gptq stage on the streamed engine: layer loop, output shards, config, head calibration, proof.

Output layout: one shard per decoder layer (hard links to the per-layer record files, so the
quantized body is written once and costs no second copy on disk), then the tensors outside the
decoder layers (embeddings, final norm, lm_head, vision tower) copied from the source's raw bytes
into shards of at most `artifact.max_shard_bytes`. `mtp.*` is left to the mtp stage. No tensor is
restored afterwards: unquantized tensors never pass through torch on their way to the output.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from qwenquant.atomic import atomic_write_bytes, pretty_json
from qwenquant.errors import StageError

log = logging.getLogger(__name__)

MTP_PREFIX = "mtp."


def shard_names(num_layers: int, rest_groups: int) -> list[str]:
    """Pure: `model-0000i-of-0000N.safetensors` for the layer shards then the rest."""
    total = num_layers + rest_groups
    return [f"model-{i:05d}-of-{total:05d}.safetensors" for i in range(1, total + 1)]


def run_streamed_gptq(source_dir: Path, samples: list[list[int]], recipe: Any, out_dir: Path, *,
                      layers_root: Path, fingerprint: str, device: str, max_gpu_mem_gib: float | None = None,
                      progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Quantize the body into `out_dir` (a fresh folder) layer by layer; return stage info."""
    import os

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from qwenquant.engine import headcal
    from qwenquant.engine.model import open_source
    from qwenquant.engine.quantize import quantization_config, resolve_scheme
    from qwenquant.engine.run import ENGINE_VERSION, apply_gpu_cap, stream_quantize
    from qwenquant.stages.assemble import link_or_copy
    from qwenquant.stages.gptq import carry_side_files, quantized_config, set_deterministic
    from qwenquant.stages.headquant import split_heldout
    from qwenquant.stages.records import sha256_json
    from qwenquant.stages.tensorfile import checkpoint_refs, plan_shards, write_index, write_shard

    set_deterministic()
    apply_gpu_cap(device, max_gpu_mem_gib)
    q = recipe.quantization
    source_dir = Path(source_dir)
    refs = checkpoint_refs(source_dir)
    src = open_source(source_dir, refs)
    fp = sha256_json({"inputs": fingerprint, "engine": ENGINE_VERSION})
    _, held = split_heldout(len(samples), recipe.lm_head.heldout_fraction if recipe.lm_head.enabled else 0.0)
    res = stream_quantize(src, samples, q, Path(layers_root), fingerprint=fp, device=device, heldout=held,
                          progress=progress)

    rest = {n: r for n, r in refs.items() if not n.startswith(MTP_PREFIX) and not src.is_layer_tensor(n)}
    groups = list(plan_shards(rest, recipe.artifact.max_shard_bytes).values())
    names = shard_names(src.num_layers, len(groups))
    weight_map: dict[str, str] = {}
    total = 0
    for f, shard in zip(res.layer_files, names):
        link_or_copy(f, out_dir / shard)
    from qwenquant.stages.tensorfile import shard_refs

    for shard in names[: src.num_layers]:
        for n, r in shard_refs(out_dir / shard).items():
            weight_map[n] = shard
            total += r.nbytes
    for group, shard in zip(groups, names[src.num_layers:]):
        write_shard(out_dir / shard, [rest[n] for n in group])
        for n in group:
            weight_map[n] = shard
            total += rest[n].nbytes
    write_index(out_dir, weight_map, total)
    src_cfg = json.loads((source_dir / "config.json").read_text())
    saved = {"quantization_config": quantization_config(resolve_scheme(q))}
    atomic_write_bytes(out_dir / "config.json", pretty_json(quantized_config(src_cfg, saved, list(q.ignore))))
    carry_side_files(source_dir, out_dir)
    headcal.save(out_dir, res.head)
    _prove(out_dir, source_dir, q)
    shutil.rmtree(layers_root, ignore_errors=True)  # the stage folder holds hard links to every layer file
    log.info("gptq: %d Linear modules quantized over %d decoder layers (%d resumed)", res.quantized_modules,
             src.num_layers, res.resumed_from)
    return {"quantized_modules": res.quantized_modules, "tensors": len(weight_map), "engine": ENGINE_VERSION}


def _prove(out_dir: Path, source_dir: Path, q: Any) -> None:
    from qwenquant.stages.identity import prove_unquantized_identical, recipe_quantizes

    problems = prove_unquantized_identical(
        out_dir, source_dir, rename=lambda n: n,
        may_quantize=recipe_quantizes(list(q.ignore), head_quantized=False),
        skip_source=lambda n: n.startswith(MTP_PREFIX))
    if problems:
        raise StageError("GPTQ output: tensors the recipe does not quantize differ from the source:\n  "
                         + "\n  ".join(problems[:20]), hint="this is a bug in the streamed engine; file it with the log")
