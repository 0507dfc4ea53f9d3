"""The gptq stage's folder on the streamed engine: layer loop, output shards, index, head calibration.

Output layout: one shard per decoder layer (hard links to the per-layer record files, so the
quantized body is written once and costs no second copy on disk), then the tensors outside the
decoder layers (embeddings, final norm, lm_head, vision tower) copied from the source's raw bytes
into shards of at most `max_shard_bytes`. `mtp.*` is left to the mtp stage (a quantized MTP head's
packed Linears wait for it in `mtp-gptq/`, engine/mtpcal.py). No tensor is restored
afterwards: unquantized tensors never pass through torch on their way to the output. The gptq
stage (stages/gptq.py) then writes config.json and side files and runs the identity proof, as it
does for the oneshot engine, and only after that drops the layer records (`discard_layers`).
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qwenquant import envs
from qwenquant.checkpoint.names import MTP_PREFIX
from qwenquant.errors import UsageError

if TYPE_CHECKING:
    from qwenquant.hashing import DigestCache
    from qwenquant.quantize.timings import Timings
    from qwenquant.recipe import QuantizationSpec

log = logging.getLogger(__name__)

GPU_CAP_ENV = "QWENQUANT_MAX_GPU_MEM"


def shard_names(num_layers: int, rest_groups: int) -> list[str]:
    """Pure: `model-0000i-of-0000N.safetensors` for the layer shards then the rest."""
    total = num_layers + rest_groups
    return [f"model-{i:05d}-of-{total:05d}.safetensors" for i in range(1, total + 1)]


def max_gpu_mem_gib() -> float | None:
    """The CUDA memory cap in GiB from QWENQUANT_MAX_GPU_MEM (e.g. 23.5: a big GPU behaves like a
    24 GB card), or None when unset (envs: a number > 0, else UsageError)."""
    return envs.get(GPU_CAP_ENV)


def run_streamed_gptq(
    source_dir: Path,
    samples: list[list[int]],
    q: QuantizationSpec,
    out_dir: Path,
    *,
    heldout: list[int],
    max_shard_bytes: int,
    layers_root: Path,
    fingerprint: str,
    device: str,
    progress: Callable[[int, int], None] | None = None,
    ranks: int = 1,
    mtp: bool = False,
    digests: DigestCache | None = None,
    timings: Timings | None = None,
) -> dict[str, Any]:
    """Quantize the body into `out_dir` (a fresh folder) layer by layer, resuming from the layer records under
    `layers_root`; write the tensors, the index and the head calibration; return stage info. `heldout`: the sample
    indices the lm_head stage keeps for its quality report. `ranks` > 1: an N-process job (engine/launch.py) whose
    rank 0 writes the same folder. `mtp`: also GPTQ the MTP head on the same pass (engine/mtpcal.py; one process
    only). `digests`: the run's cache (one process: it gets every layer file's digest). `timings`: gets the layer
    phases and the parts after the loop (with `ranks` > 1: rank 0's, and every rank's figures)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if ranks > 1:
        job = {
            "source_dir": str(source_dir),
            "samples": samples,
            "quantization": q.model_dump(mode="json"),
            "out_dir": str(out_dir),
            "heldout": list(heldout),
            "max_shard_bytes": max_shard_bytes,
            "layers_root": str(layers_root),
            "fingerprint": fingerprint,
            "device": device,
        }
        return _run_job(job, ranks, mtp, progress, timings)
    from qwenquant.checkpoint.tensorfile import checkpoint_refs
    from qwenquant.modeling.text import open_source
    from qwenquant.quantize.engine.run import apply_gpu_cap, stream_quantize

    apply_gpu_cap(device, max_gpu_mem_gib())
    src = open_source(Path(source_dir), checkpoint_refs(Path(source_dir)))
    res = stream_quantize(
        src,
        samples,
        q,
        Path(layers_root),
        fingerprint=fingerprint,
        device=device,
        heldout=heldout,
        progress=progress,
        mtp=mtp,
        digests=digests,
    )
    info = write_stage_folder(src, res, out_dir, max_shard_bytes)
    if timings is not None:
        timings.gptq_layers = res.phases
        timings.add_tail(res.tail)
    return info


def _run_job(
    job: dict[str, Any], ranks: int, mtp: bool, progress: Callable[[int, int], None] | None, timings: Timings | None
) -> dict[str, Any]:
    """The stage info of an N-process job (engine/launch.py; `job`: what each rank reads), rank 0 writing the
    stage folder; `timings` gets rank 0's layer phases and tail, and every rank's figures. A UsageError for `mtp`:
    the MTP head's GPTQ runs in one process."""
    from qwenquant.quantize.engine.launch import run_job

    if mtp:
        raise UsageError(
            f"--gpus {ranks}: the MTP head's GPTQ (mtp.quantize: gptq) runs in one process",
            hint="drop --gpus, or keep the MTP head bf16 (mtp.quantize: bf16)",
        )
    done = run_job(job, ranks, Path(job["layers_root"]).parent, progress)
    if timings is not None:
        timings.gptq_layers, timings.gptq_ranks = done["layers"], done["ranks"]
        timings.add_tail(done["tail"])
    return done["info"]


def write_stage_folder(src: Any, res: Any, out_dir: Path, max_shard_bytes: int) -> dict[str, Any]:
    """The stage folder from a finished layer loop (`res`: engine.run.StreamResult, its head
    calibration complete): layer shards, the rest from the source bytes, index, head calibration.
    The seconds of each part join `res.tail`."""
    from qwenquant.checkpoint.assemble import link_or_copy
    from qwenquant.checkpoint.tensorfile import plan_shards, shard_refs, write_index, write_shard
    from qwenquant.quantize.engine import headcal
    from qwenquant.quantize.engine.layers import ENGINE_VERSION
    from qwenquant.quantize.engine.phases import Phases

    refs = src.refs
    rest = {n: r for n, r in refs.items() if not n.startswith(MTP_PREFIX) and not src.is_layer_tensor(n)}
    groups = list(plan_shards(rest, max_shard_bytes).values())
    names = shard_names(src.num_layers, len(groups))
    weight_map: dict[str, str] = {}
    total = 0
    part = Phases("cpu")  # host work only
    with part("layer_links"):
        for f, shard in zip(res.layer_files, names, strict=False):  # names go on past the layers
            link_or_copy(f, out_dir / shard)
            for n, r in shard_refs(out_dir / shard).items():
                weight_map[n] = shard
                total += r.nbytes
    with part("rest_shards"):
        for group, shard in zip(groups, names[src.num_layers :], strict=False):
            write_shard(out_dir / shard, [rest[n] for n in group])
            for n in group:
                weight_map[n] = shard
                total += rest[n].nbytes
    with part("index_and_calibration"):
        write_index(out_dir, weight_map, total)
        headcal.save(out_dir, res.head)
        if getattr(res, "mtp", None) is not None:
            from qwenquant.quantize.engine import mtpcal

            mtpcal.save(out_dir, res.mtp)
    log.debug("gptq: stage folder (s): %s", part.line())
    res.tail.update(part.seconds)
    log.info(
        "gptq: %d Linear modules quantized over %d decoder layers (%d resumed)",
        res.quantized_modules,
        src.num_layers,
        res.resumed_from,
    )
    return {"quantized_modules": res.quantized_modules, "tensors": len(weight_map), "engine": ENGINE_VERSION}


def discard_layers(layers_root: Path) -> None:
    """Drop the per-layer records once the stage folder is complete (it holds hard links to every
    layer file, so no quantized bytes are lost)."""
    shutil.rmtree(layers_root, ignore_errors=True)
