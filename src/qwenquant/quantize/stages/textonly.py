"""Text-only layout: a `Qwen3_5ForCausalLM` checkpoint vLLM serves without the vision tower.

vLLM's `Qwen3_5ForCausalLM.load_weights` maps no prefixes (AutoWeightsLoader, `mtp.` skipped), so
its tensors are `model.layers.*`, `model.embed_tokens.*`, `model.norm.*`, `lm_head.*`: the HF
`model.language_model.` prefix becomes `model.` (transformers' qwen3_5_text conversion maps it
the same way, so both load). mrope keys are dropped from the rope parameters: vLLM strips them from
the target config but not from the MTP drafter's, which then crashes (docs/known-issues.md#text-only-mrope).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from qwenquant.checkpoint.assemble import current_plan, derive_checkpoint, map_plan
from qwenquant.checkpoint.config import read_config
from qwenquant.checkpoint.names import LM_PREFIX
from qwenquant.hashing import sha256_json
from qwenquant.quantize.stage import Stage, StageContext

TEXT_ARCH = "Qwen3_5ForCausalLM"
TEXT_MODEL_TYPE = "qwen3_5_text"
VISION_PREFIX = "model.visual."
PROCESSOR_FILES = ("preprocessor_config.json", "video_preprocessor_config.json", "processor_config.json")
_MROPE_KEYS = ("mrope_section", "mrope_interleaved")
# Multimodal-only keys of the top-level config; they mean nothing to a text model.
_MM_KEYS = (
    "text_config",
    "vision_config",
    "image_token_id",
    "video_token_id",
    "vision_start_token_id",
    "vision_end_token_id",
    "architectures",
    "model_type",
)


def plain_rope(rope: dict[str, Any] | None) -> dict[str, Any] | None:
    """Rope parameters without mrope (keeps rope_theta, partial_rotary_factor, rope_type)."""
    if rope is None:
        return None
    out = {k: v for k, v in rope.items() if k not in _MROPE_KEYS}
    if out.get("rope_type") in (None, "mrope"):
        out["rope_type"] = "default"
    return out


def text_only_config(config: dict[str, Any]) -> dict[str, Any]:
    """Pure: the multimodal Qwen3.5 config rewritten as a text-only one (a new dict)."""
    if config.get("model_type") == TEXT_MODEL_TYPE:
        out = copy.deepcopy(config)
    else:
        text = copy.deepcopy(config.get("text_config") or {})
        out = {k: copy.deepcopy(v) for k, v in config.items() if k not in _MM_KEYS}
        out.update(text)
        for key in ("eos_token_id", "bos_token_id", "pad_token_id"):
            if out.get(key) is None and config.get(key) is not None:
                out[key] = config[key]
        if "dtype" not in out and "torch_dtype" in config:
            out["dtype"] = config["torch_dtype"]
    out["architectures"] = [TEXT_ARCH]
    out["model_type"] = TEXT_MODEL_TYPE
    out["tie_word_embeddings"] = False
    for key in ("rope_parameters", "rope_scaling"):
        if isinstance(out.get(key), dict):
            out[key] = plain_rope(out[key])
    return out


def text_only_name(name: str) -> str | None:
    """Pure: the text-only tensor name (None: the tensor is dropped)."""
    if name.startswith(VISION_PREFIX):
        return None
    if name.startswith(LM_PREFIX):
        return "model." + name[len(LM_PREFIX) :]
    return name


def rewrite_text_only(prev_dir: Path, out_dir: Path) -> dict[str, Any]:
    """Write the text-only checkpoint of `prev_dir` into `out_dir`; return what changed."""
    plan = current_plan(prev_dir)
    before = sum(len(t) for t in plan.values())
    new_plan = map_plan(plan, text_only_name)
    derive_checkpoint(prev_dir, out_dir, new_plan, text_only_config(read_config(prev_dir)), drop_files=PROCESSOR_FILES)
    after = sum(len(t) for t in new_plan.values())
    return {"layout": "text-only", "tensors_dropped": before - after, "architecture": TEXT_ARCH}


def keep_multimodal(prev_dir: Path, out_dir: Path) -> dict[str, Any]:
    """The multimodal layout: same tensors, names and config (all files linked)."""
    derive_checkpoint(prev_dir, out_dir, current_plan(prev_dir), read_config(prev_dir))
    return {
        "layout": "multimodal",
        "tensors_dropped": 0,
        "architecture": (read_config(prev_dir).get("architectures") or [None])[0],
    }


def _run(ctx: StageContext, out_dir: Path) -> dict[str, Any]:
    prev = ctx.dir("mtp")
    return (
        rewrite_text_only(prev, out_dir)
        if ctx.recipe.artifact.layout == "text-only"
        else keep_multimodal(prev, out_dir)
    )


STAGE = Stage(
    "textonly",
    lambda ctx: {"mtp": ctx.digest("mtp"), "layout": sha256_json(ctx.recipe.artifact.layout)},
    lambda ctx: {"layout": ctx.recipe.artifact.layout},
    _run,
    builds_checkpoint=True,
)
