"""GPTQ stage: the decoder layers' Linears to int4 on the calibration tokens, then prove.

Two engines, chosen by QWENQUANT_GPTQ_ENGINE (`gptq_engine`):
- `streamed` (default): quantize/engine/, one decoder layer in memory at a time, resumable per
  layer; it also leaves the lm_head stage its calibration (engine/headcal.py). Unquantized tensors
  are copied as the source's raw bytes.
- `oneshot`: llm-compressor `oneshot` on the whole model (quantize/oneshot.py). llm-compressor 0.14
  wraps every oneshot in `norm_calibration_context`, which rounds each offset-norm weight through bf16
  as (1 + w) and back, so the saved norms differ from the source (docs/known-issues.md#norm-rounding);
  0.14 has no switch to turn it off, so after the save every tensor the recipe does not quantize is
  taken back from the source bytes (`restore_plan`) and shards are re-written deterministically.
Either way `identity.prove_unquantized_identical` checks the output on every build. MTP tensors
are left out here and grafted by the mtp stage.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qwenquant import envs
from qwenquant.atomic import atomic_write_bytes, pretty_json
from qwenquant.checkpoint.identity import prove_unquantized_identical, quantized_module, recipe_quantizes
from qwenquant.checkpoint.names import MTP_IGNORE, MTP_PREFIX
from qwenquant.checkpoint.tensorfile import TensorRef, checkpoint_refs, write_checkpoint_tensors
from qwenquant.errors import StageError, UsageError
from qwenquant.hashing import sha256_json
from qwenquant.modeling.runtime import set_deterministic, thread_fields
from qwenquant.quantize.stage import Stage, StageContext

if TYPE_CHECKING:
    from qwenquant.hashing import DigestCache
    from qwenquant.quantize.timings import Timings
    from qwenquant.recipe import QuantizationSpec

log = logging.getLogger(__name__)

ENGINES = ("streamed", "oneshot")
LAYERS_DIR = "gptq-layers"  # the streamed engine's per-layer records, <work>/gptq-layers/
LAYERS_TASK = "gptq layers"  # the stage's progress bar (decoder layers; modules on the oneshot engine)
# Side files carried from the source into the artifact (processor files dropped later by text-only).
CARRY_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
    "preprocessor_config.json",
    "video_preprocessor_config.json",
    "processor_config.json",
    "LICENSE",
)


def restore_plan(saved: Mapping[str, TensorRef], source: Mapping[str, TensorRef]) -> dict[str, TensorRef]:
    """Pure: the tensors of the GPTQ output, every unquantized one taken from the source bytes.

    Quantization parameters (`*.weight_packed`, `*.weight_scale`, ...) come from the save; any other
    tensor comes from the source under the same name; `mtp.*` is left to the mtp stage.
    """
    out: dict[str, TensorRef] = {}
    for name, ref in saved.items():
        if name.startswith(MTP_PREFIX):
            continue
        if quantized_module(name) is not None:
            out[name] = ref
        elif name in source:
            out[name] = source[name]
        else:
            raise StageError(
                f"GPTQ output tensor {name} has no source tensor to restore it from",
                hint="the source checkpoint and the model llm-compressor saved disagree; file a bug",
            )
    return out


def quantized_config(
    source_config: dict[str, Any], saved_config: dict[str, Any], ignore: list[str], *, mtp_quantized: bool = False
) -> dict[str, Any]:
    """Pure: the source config plus llm-compressor's quantization_config, with the recipe's ignore
    patterns (layout-independent regexes) in place of the expanded module names, and `re:^mtp.*`
    unless the MTP head is quantized (then the body's `Linear` group covers its Linears)."""
    qc = dict(saved_config["quantization_config"])
    patterns = [p for p in ignore]
    if MTP_IGNORE not in patterns and not mtp_quantized:
        patterns.append(MTP_IGNORE)
    qc["ignore"] = patterns
    cfg = json.loads(json.dumps(source_config))
    cfg["quantization_config"] = qc
    return cfg


def run_gptq(
    source_dir: Path,
    samples: list[list[int]],
    q: QuantizationSpec,
    out_dir: Path,
    *,
    max_shard_bytes: int,
    device: str,
    progress: Callable[[int, int], None] | None = None,
    digests: DigestCache | None = None,
    timings: Timings | None = None,
) -> dict[str, Any]:
    """Quantize the body into `out_dir` (a fresh folder) on the oneshot engine (quantize/oneshot.py), every
    unquantized tensor restored from the source; return stage info. Raises StageError.
    `digests`: the run's cache, for the identity proof (`finish_output`, which adds its seconds to
    `timings`)."""
    from qwenquant.quantize.oneshot import oneshot_save

    source_dir = Path(source_dir)
    raw = oneshot_save(source_dir, samples, q, out_dir, device=device, progress=progress)
    saved_cfg = json.loads((raw / "config.json").read_text())
    tensors = restore_plan(checkpoint_refs(raw), checkpoint_refs(source_dir))
    write_checkpoint_tensors(out_dir, tensors, max_shard_bytes)
    shutil.rmtree(raw)
    finish_output(source_dir, out_dir, q, saved_cfg["quantization_config"], digests=digests, timings=timings)
    quantized = sorted({m for n in tensors if (m := quantized_module(n))})
    log.info(
        "gptq: %d Linear modules quantized; %d unquantized tensors byte-identical to the source",
        len(quantized),
        sum(1 for n in tensors if quantized_module(n) is None),
    )
    return {"quantized_modules": len(quantized), "tensors": len(tensors)}


def finish_output(
    source_dir: Path,
    out_dir: Path,
    q: QuantizationSpec,
    quantization_config: dict[str, Any],
    *,
    mtp_quantized: bool = False,
    digests: DigestCache | None = None,
    timings: Timings | None = None,
) -> None:
    """Write config.json (source config + `quantization_config`) and the side files into `out_dir`,
    then prove every tensor the recipe does not quantize byte-identical to the source (`digests`:
    the run's cache; the check stage's proof of the same tensors reuses what this one hashes;
    `timings`: gets the proof's seconds as `identity_proof`)."""
    src_cfg = json.loads((Path(source_dir) / "config.json").read_text())
    config = quantized_config(
        src_cfg, {"quantization_config": quantization_config}, list(q.ignore), mtp_quantized=mtp_quantized
    )
    atomic_write_bytes(out_dir / "config.json", pretty_json(config))
    carry_side_files(source_dir, out_dir)
    t0 = time.perf_counter()
    problems = prove_unquantized_identical(
        out_dir,
        source_dir,
        rename=lambda n: n,
        may_quantize=recipe_quantizes(list(q.ignore), head_quantized=False),
        skip_source=lambda n: n.startswith(MTP_PREFIX),
        digests=digests,
    )
    proof = time.perf_counter() - t0
    log.debug("gptq: identity proof %.2f s", proof)
    if timings is not None:
        timings.add_tail({"identity_proof": proof})
    if problems:
        raise StageError(
            "GPTQ output: tensors the recipe does not quantize differ from the source:\n  "
            + "\n  ".join(problems[:20]),
            hint="this is a bug in the gptq stage; file it with the log",
        )


def carry_side_files(source_dir: Path, out_dir: Path) -> list[str]:
    """Copy tokenizer, chat template, generation and processor configs from the source."""
    carried = []
    for name in CARRY_FILES:
        p = Path(source_dir) / name
        if p.is_file():
            atomic_write_bytes(Path(out_dir) / name, p.read_bytes())
            carried.append(name)
    return carried


def gptq_engine() -> str:
    """`streamed` (layer by layer, resumable; quantize/engine/) or `oneshot` (llm-compressor whole-model),
    from QWENQUANT_GPTQ_ENGINE."""
    name = envs.get("QWENQUANT_GPTQ_ENGINE")
    if name not in ENGINES:
        raise UsageError(
            f"QWENQUANT_GPTQ_ENGINE must be streamed or oneshot, got {name!r}",
            hint="unset QWENQUANT_GPTQ_ENGINE to use the streamed engine",
        )
    return name


def heldout_fraction(ctx: StageContext) -> float:
    """The share of calibration samples the lm_head stage keeps for its quality report (the
    streamed engine calibrates the head in its own pass, so its output depends on it)."""
    return ctx.recipe.lm_head.heldout_fraction if ctx.recipe.lm_head.enabled else 0.0


def rank_fields(ranks: int) -> dict[str, int]:
    """Pure: what the record says about the process count. The Hessian sum's association differs
    with the count, so its bits (and the int4 codes) may too: recorded, but only when above one,
    so one-process records, manifests and root digests stay as they were."""
    return {"ranks": ranks} if ranks > 1 else {}


def _inputs(ctx: StageContext) -> dict[str, str]:
    return {
        "source": ctx.digest("source"),
        "calibration": ctx.digest("calibration"),
        "quantization": sha256_json(ctx.recipe.quantization.model_dump(mode="json")),
        "artifact": sha256_json(ctx.recipe.artifact.model_dump(mode="json")),
        "device": ctx.device,
        "engine": gptq_engine(),
        "heldout": str(heldout_fraction(ctx)),
        "hessian_precision": hessian_precision(ctx.recipe.quantization),
        **{k: str(v) for k, v in rank_fields(ctx.ranks).items()},
        **mtp_fields(ctx),
        **thread_fields(ctx.device),
    }


def mtp_fields(ctx: StageContext) -> dict[str, str]:
    """Pure: what the record says about the MTP head: nothing for a bf16 head (records, manifests and
    root digests stay as they were), `mtp: gptq` when this stage also quantizes it."""
    return {"mtp": "gptq"} if ctx.recipe.mtp_quantized else {}


def hessian_precision(q: QuantizationSpec) -> str:
    """The Hessian arithmetic the gptq stage uses: the recipe's on the streamed engine; the oneshot
    engine is llm-compressor's own float32 arithmetic throughout (named in the stage inputs, so
    `quantize --plan` says a changed setting is why gptq re-runs)."""
    return q.hessian_precision if gptq_engine() == "streamed" else "fp32"


def _params(ctx: StageContext) -> dict[str, Any]:
    return {
        "quantization": ctx.recipe.quantization.model_dump(mode="json"),
        "device": ctx.device,
        **rank_fields(ctx.ranks),
        **mtp_fields(ctx),
    }


def layer_fingerprint(ctx: StageContext) -> str:
    """What every layer record of the streamed engine depends on (the held-out split only shapes
    the head calibration, so it is not part of it; the CPU thread count is: a resume never replays
    layers summed with another count)."""
    from qwenquant.quantize.engine.layers import ENGINE_VERSION

    return sha256_json(
        {
            "source": ctx.digest("source"),
            "calibration": ctx.digest("calibration"),
            "quantization": ctx.recipe.quantization.model_dump(mode="json"),
            "device": ctx.device,
            "engine": ENGINE_VERSION,
            **rank_fields(ctx.ranks),
            **thread_fields(ctx.device),
        }
    )


def _plan_note(ctx: StageContext) -> str | None:
    """Where the streamed engine would resume: the layer records that match (sizes, not bytes)."""
    from qwenquant.checkpoint.config import read_config, text_config
    from qwenquant.quantize.engine.layers import recorded_layers, resume_point

    if gptq_engine() != "streamed":
        return None
    n = int(text_config(read_config(ctx.source))["num_hidden_layers"])
    done = recorded_layers(ctx.work / LAYERS_DIR, n, layer_fingerprint(ctx))
    if done == 0:
        return f"{resume_point(0, n)} (no layer record matches)"
    return f"{resume_point(done, n)}; the records' bytes are checked when it runs"


def _run_streamed(ctx: StageContext, samples: list[list[int]], out_dir: Path) -> dict[str, Any]:
    from qwenquant.modeling.compat import quantization_config, resolve_scheme
    from qwenquant.quantize.engine.build import discard_layers, run_streamed_gptq
    from qwenquant.quantize.stages.lm_head import split_heldout

    q = ctx.recipe.quantization
    layers_root = ctx.work / LAYERS_DIR
    fingerprint = layer_fingerprint(ctx)
    if ctx.ranks > len(samples):
        raise UsageError(
            f"--gpus {ctx.ranks} but the calibration set has {len(samples)} samples: every process needs at least one",
            hint=f"pass --gpus {len(samples)} or fewer, or calibrate on more samples",
        )
    _, held = split_heldout(len(samples), heldout_fraction(ctx))
    info = run_streamed_gptq(
        ctx.source,
        samples,
        q,
        out_dir,
        heldout=held,
        max_shard_bytes=ctx.recipe.artifact.max_shard_bytes,
        layers_root=layers_root,
        fingerprint=fingerprint,
        device=ctx.device,
        progress=ctx.progress_for(LAYERS_TASK),
        ranks=ctx.ranks,
        mtp=ctx.recipe.mtp_quantized,
        digests=ctx.digests,
        timings=ctx.timings,
    )
    finish_output(
        ctx.source,
        out_dir,
        q,
        quantization_config(resolve_scheme(q)),
        mtp_quantized=ctx.recipe.mtp_quantized,
        digests=ctx.digests,
        timings=ctx.timings,
    )
    discard_layers(layers_root)
    return info


def _run(ctx: StageContext, out_dir: Path) -> dict[str, Any]:
    from qwenquant.quantize.stages.calibration import load_tokens

    samples = load_tokens(ctx.dir("calibration"))
    set_deterministic()
    if gptq_engine() == "streamed":
        return _run_streamed(ctx, samples, out_dir)
    if ctx.recipe.quantization.hessian_precision != "fp32":
        log.info(
            "gptq: the oneshot engine accumulates Hessians in llm-compressor's float32 arithmetic "
            "(quantization.hessian_precision %s applies to the streamed engine)",
            ctx.recipe.quantization.hessian_precision,
        )
    if ctx.ranks > 1:
        raise UsageError(
            f"--gpus {ctx.ranks} runs the streamed engine; QWENQUANT_GPTQ_ENGINE=oneshot is one process",
            hint="unset QWENQUANT_GPTQ_ENGINE, or drop --gpus",
        )
    if ctx.recipe.mtp_quantized:
        raise UsageError(
            "mtp.quantize: gptq calibrates the MTP head inside the streamed engine's pass; "
            "QWENQUANT_GPTQ_ENGINE=oneshot has no such pass",
            hint="unset QWENQUANT_GPTQ_ENGINE, or keep the MTP head bf16 (mtp.quantize: bf16)",
        )
    return run_gptq(
        ctx.source,
        samples,
        ctx.recipe.quantization,
        out_dir,
        max_shard_bytes=ctx.recipe.artifact.max_shard_bytes,
        device=ctx.device,
        progress=ctx.progress_for(LAYERS_TASK),
        digests=ctx.digests,
        timings=ctx.timings,
    )


STAGE = Stage("gptq", _inputs, _params, _run, builds_checkpoint=True, tasks=(LAYERS_TASK,), plan_note=_plan_note)
