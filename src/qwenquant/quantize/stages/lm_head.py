"""lm_head stage: activation-calibrated int4 head (the math: quantize/head_gptq.py, modeling/head_quality.py).

Final-norm hidden states over the calibration tokens feed the head's Hessian; `heldout_fraction`
of the samples (the last ones, deterministic) are kept back for the quality report (KL and top-1
against the bf16 head, GPTQ vs RTN). The streamed gptq engine computes both in its own pass and
leaves them in the gptq stage folder (engine/headcal.py): this stage's first step reads them
there. Only after the oneshot engine, which leaves none, is the whole model loaded to capture them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qwenquant.checkpoint.assemble import current_plan, derive_checkpoint, torch_raw
from qwenquant.checkpoint.config import read_config
from qwenquant.checkpoint.names import LM_HEAD_TARGET
from qwenquant.checkpoint.tensorfile import checkpoint_refs
from qwenquant.errors import StageError
from qwenquant.hashing import sha256_json
from qwenquant.modeling.runtime import thread_fields
from qwenquant.quantize.stage import Stage, StageContext

if TYPE_CHECKING:
    import torch

    from qwenquant.quantize.engine.headcal import HeadCalibration
    from qwenquant.recipe import LmHeadSpec

log = logging.getLogger(__name__)

HEAD = "lm_head"
ROW_CHUNKS = "lm_head row chunks"  # the stage's progress bar


def split_heldout(n: int, fraction: float) -> tuple[list[int], list[int]]:
    """Pure: (calibration indices, held-out indices); the last round(n * fraction) samples, at
    least one when fraction > 0 and n > 1, are held out."""
    held = 0 if fraction <= 0 or n < 2 else min(n - 1, max(1, round(n * fraction)))
    return list(range(n - held)), list(range(n - held, n))


def head_quant_config(config: dict[str, Any], group: dict[str, Any]) -> dict[str, Any]:
    """Pure: config with the head's config group added (next free `group_N`) and lm_head un-ignored."""
    import copy

    out = copy.deepcopy(config)
    qc = out["quantization_config"]
    groups = qc.setdefault("config_groups", {})
    for name, g in list(groups.items()):
        if g.get("targets") == group.get("targets"):
            del groups[name]
    i = 0
    while f"group_{i}" in groups:
        i += 1
    groups[f"group_{i}"] = group
    qc["ignore"] = [
        p for p in (qc.get("ignore") or []) if p not in ("lm_head", LM_HEAD_TARGET, "language_model.lm_head")
    ]
    return out


def _load_model(source_dir: Path, device: str) -> Any:
    import transformers

    cfg = read_config(source_dir)
    arch = (cfg.get("architectures") or ["Qwen3_5ForConditionalGeneration"])[0]
    cls = getattr(transformers, arch)
    kwargs: dict[str, Any] = {"dtype": "auto"}
    if device == "cuda":
        kwargs["device_map"] = "auto"  # spills to CPU what does not fit on the GPU
    model = cls.from_pretrained(str(source_dir), **kwargs)
    return model.eval()


def _capture_from_model(source_dir: Path, samples: list[list[int]], spec: LmHeadSpec, device: str) -> HeadCalibration:
    """Final hidden states from the whole original-precision model (after the oneshot engine)."""
    import torch

    from qwenquant.quantize import head_gptq as lh
    from qwenquant.quantize.engine.headcal import HeadCalibration

    calib_idx, held_idx = split_heldout(len(samples), spec.heldout_fraction)
    model = _load_model(source_dir, device)
    H: torch.Tensor | None = None
    n_tokens = 0
    held: list[torch.Tensor] = []

    def fold(hidden: torch.Tensor) -> None:
        nonlocal H, n_tokens
        # the oneshot engine's path: float32 arithmetic, as the rest of that engine
        H, n_tokens = lh.accumulate_hessian(H, hidden.float().to(device), n_tokens)

    def batches(idx: list[int]) -> Any:
        for i in idx:
            yield {"input_ids": torch.tensor([samples[i]], dtype=torch.long)}

    lh.capture_final_hidden(model, batches(calib_idx), fold)
    if held_idx:
        lh.capture_final_hidden(model, batches(held_idx), lambda h: held.append(h.float().cpu()))
    del model
    if H is None:
        raise StageError("no calibration tokens reached lm_head", hint="check the calibration set")
    return HeadCalibration(H, n_tokens, torch.cat(held) if held else None, len(held_idx))


def _quality(spec: LmHeadSpec, report: dict[str, Any] | None, cal: HeadCalibration, fallback: bool) -> dict[str, Any]:
    """The quality report the record, the manifest and qwenquant-quality.json keep."""
    pick = (lambda k: report[k]) if report else (lambda k: None)
    return {
        "lm_head": {
            "method": spec.method,
            "rtn": pick("rtn"),
            "gptq": pick("gptq"),
            "kl_reduction_pct": pick("kl_reduction_pct"),
            "calibration_tokens": int(cal.tokens),
            "heldout_tokens": int(cal.heldout.shape[0]) if cal.heldout is not None else 0,
            "heldout_samples": cal.heldout_samples,
            "evaluated_on": "heldout" if report else "none",
            "used_rtn_fallback": bool(fallback),
        }
    }


def gpu_budget(device: str) -> int | None:
    """Bytes the head's row chunks may use on the GPU (head_memory.budget_bytes), None on the CPU:
    free CUDA memory plus torch's unused cache, under the per-process fraction and the
    QWENQUANT_MAX_GPU_MEM cap (engine/build.max_gpu_mem_gib)."""
    if device != "cuda":
        return None
    import torch

    from qwenquant.quantize.engine.build import max_gpu_mem_gib
    from qwenquant.quantize.head_memory import budget_bytes

    dev = torch.device("cuda", torch.cuda.current_device())
    free, total = torch.cuda.mem_get_info(dev)
    allocated = torch.cuda.memory_allocated(dev)
    cap = torch.cuda.get_per_process_memory_fraction(dev) * total
    gib = max_gpu_mem_gib()
    if gib:
        cap = min(cap, gib * (1 << 30))
    return budget_bytes(free, torch.cuda.memory_reserved(dev) - allocated, int(cap) - allocated)


def _better_than_rtn(spec: LmHeadSpec) -> Callable[[dict[str, Any]], None]:
    def gate(report: dict[str, Any]) -> None:
        if spec.require_better_than_rtn and spec.method == "gptq" and report["gptq"]["kl"] >= report["rtn"]["kl"]:
            raise StageError(
                f"lm_head GPTQ is not better than RTN on held-out tokens (KL {report['gptq']['kl']:.6g} >= "
                f"{report['rtn']['kl']:.6g})",
                hint="use more calibration samples, or set lm_head.require_better_than_rtn: false",
            )

    return gate


def _calibration(
    source_dir: Path, samples: list[list[int]], spec: LmHeadSpec, prev_dir: Path, device: str
) -> tuple[HeadCalibration, torch.Tensor]:
    """The head's calibration: the one the streamed gptq engine left in `prev_dir` (its own pass),
    else captured here from the source model; refused without a Hessian (neither source gives one
    without it, but a calibration that has none cannot quantize); with its Hessian."""
    from qwenquant.quantize.engine import headcal

    cal = headcal.load(prev_dir) or _capture_from_model(source_dir, samples, spec, device)
    if cal.hessian is None:
        raise StageError("lm_head: the head calibration holds no Hessian", hint="re-run with --force")
    return cal, cal.hessian


def run_head(
    source_dir: Path,
    samples: list[list[int]],
    spec: LmHeadSpec,
    prev_dir: Path,
    out_dir: Path,
    *,
    device: str,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Quantize lm_head into `out_dir` (= `prev_dir` with the head packed); return the quality report
    and, under "row_chunk", the row chunk that ran (the recipe's `row_chunk: auto` resolved)."""
    from qwenquant.modeling.runtime import set_deterministic
    from qwenquant.modeling.text import ref_tensor
    from qwenquant.quantize import head_gptq as lh
    from qwenquant.quantize.head_memory import resolve_row_chunk

    set_deterministic()
    cal, hessian = _calibration(source_dir, samples, spec, prev_dir, device)
    ref = checkpoint_refs(source_dir)[f"{HEAD}.weight"]
    row_chunk = resolve_row_chunk(
        spec.row_chunk,
        ref.shape[0],
        ref.shape[1],
        gpu_budget(device),
        group_size=spec.group_size,
        block_size=spec.block_size,
    )
    log.info("lm_head: %d rows at a time (row_chunk %s)", row_chunk, spec.row_chunk)
    done = lh.quantize_head(
        lambda: ref_tensor(ref),
        hessian,
        cal.heldout,
        spec,
        row_chunk=row_chunk,
        prefix=HEAD,
        device=device,
        progress=progress,
        gate=_better_than_rtn(spec),
    )
    log.info("lm_head: %s", ", ".join(f"{k} {v:.1f} s" for k, v in sorted(done.seconds.items())))
    quality = _quality(spec, done.report, cal, done.used_rtn_fallback)
    packed = {n: torch_raw(n, t, copy=False) for n, t in done.tensors.items()}
    del done

    plan = current_plan(prev_dir)
    for tensors in plan.values():
        if f"{HEAD}.weight" in tensors:
            del tensors[f"{HEAD}.weight"]
            tensors.update(packed)
            break
    else:
        raise StageError("the GPTQ output has no lm_head.weight", hint="re-run with a fresh --work folder")
    config = head_quant_config(read_config(prev_dir), lh.head_config_group(spec))
    derive_checkpoint(prev_dir, out_dir, plan, config)
    return {**quality, "row_chunk": row_chunk}


def _inputs(ctx: StageContext) -> dict[str, str]:
    return {
        "source": ctx.digest("source"),
        "calibration": ctx.digest("calibration"),
        "gptq": ctx.digest("gptq"),
        "lm_head": sha256_json(ctx.recipe.lm_head.model_dump(mode="json")),
        "device": ctx.device,
        **thread_fields(ctx.device),
    }


def _run(ctx: StageContext, out_dir: Path) -> dict[str, Any]:
    prev = ctx.dir("gptq")
    if not ctx.recipe.lm_head.enabled:
        derive_checkpoint(prev, out_dir, current_plan(prev), read_config(prev))
        return {"lm_head": {"method": "none"}}
    from qwenquant.quantize.stages.calibration import load_tokens

    return run_head(
        ctx.source,
        load_tokens(ctx.dir("calibration")),
        ctx.recipe.lm_head,
        prev,
        out_dir,
        device=ctx.device,
        progress=ctx.progress_for(ROW_CHUNKS),
    )


def _manifest(outcome: Any) -> dict[str, Any]:
    # the quality section only: the row chunk that ran stays in the stage's record (its "result"),
    # out of qwenquant-quality.json, whose bytes do not depend on the GPU's free memory
    return {"quality": {k: v for k, v in outcome.result.items() if k != "row_chunk"}}


STAGE = Stage(
    "lm_head",
    _inputs,
    lambda ctx: {"lm_head": ctx.recipe.lm_head.model_dump(mode="json"), "device": ctx.device},
    _run,
    builds_checkpoint=True,
    manifest=_manifest,
    tasks=(ROW_CHUNKS,),
)
