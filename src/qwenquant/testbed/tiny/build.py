"""Write the tiny checkpoint: config, tokenizer, processor configs, bf16 safetensors shards + index."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from qwenquant.atomic import atomic_write_bytes, pretty_json, staging_dir
from qwenquant.checkpoint.config import read_weight_map
from qwenquant.errors import QwenquantError
from qwenquant.testbed.tiny import config, tokenizer

if TYPE_CHECKING:  # torch is imported only when a checkpoint is built (keeps `--help` light)
    import torch

log = logging.getLogger(__name__)

VARIANTS = ("random", "constant")
MTP_SHARD = "model-mtp.safetensors"
BODY_SHARDS = 2
INDEX = "model.safetensors.index.json"


def build_tensors(variant: str, seed: int) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint, bf16, for `variant` and `seed` (pure, deterministic)."""
    import torch

    from qwenquant.testbed.tiny import weights

    if variant not in VARIANTS:
        raise QwenquantError(f"unknown tiny model variant {variant!r}", hint=f"use one of: {', '.join(VARIANTS)}")
    tensors = weights.random_tensors(seed)
    if variant == "constant":
        weights.make_constant(tensors, tokenizer.token_ids()["constant"], seed)
    return {name: t.to(torch.bfloat16).contiguous() for name, t in tensors.items()}


def plan_shards(tensors: dict[str, torch.Tensor], body_shards: int = BODY_SHARDS) -> dict[str, list[str]]:
    """Shard file name -> tensor names: mtp.* alone in MTP_SHARD, the rest over `body_shards` files
    cut in sorted-name order at roughly equal byte sizes."""
    body = sorted(n for n in tensors if not n.startswith("mtp."))
    sizes = {n: tensors[n].numel() * tensors[n].element_size() for n in body}
    budget = sum(sizes.values()) / body_shards
    plan: dict[str, list[str]] = {}
    part, filled = 1, 0
    for name in body:
        if filled >= budget * part and part < body_shards:
            part += 1
        plan.setdefault(f"model-{part:05d}-of-{body_shards:05d}.safetensors", []).append(name)
        filled += sizes[name]
    plan[MTP_SHARD] = sorted(n for n in tensors if n.startswith("mtp."))
    return plan


def _write_json(path: Path, obj: object) -> None:
    atomic_write_bytes(path, pretty_json(obj))


def build_tiny_checkpoint(out_dir: Path, *, variant: str = "random", seed: int = 0) -> Path:
    """Write a tiny Qwen3.5 checkpoint (HF layout of Qwen3.8-27B) into `out_dir`; return `out_dir`.

    Files: config.json, generation_config.json, tokenizer.json, tokenizer_config.json (ChatML chat
    template), preprocessor_config.json, video_preprocessor_config.json, bf16 shards
    model-0000{1,2}-of-00002.safetensors (language model, lm_head, vision tower),
    model-mtp.safetensors (the 15 mtp.* tensors) and model.safetensors.index.json.

    variant "random": seeded random weights (MTP drafts almost never accepted).
    variant "constant": target and MTP head both predict `constant_token_id()` (" the") for any
    input, with margins that survive int4; construction in `weights.make_constant`.

    Same bytes on every run for the same torch version, variant and seed. `out_dir` is built in a
    staging folder beside it and renamed into place (an existing `out_dir` is replaced).
    """
    out_dir = Path(out_dir)
    write_checkpoint(out_dir, build_tensors(variant, seed))
    log.info("wrote tiny %s checkpoint (seed %d) to %s", variant, seed, out_dir)
    return out_dir


def write_checkpoint(
    out_dir: Path,
    tensors: dict[str, torch.Tensor],
    tokenizer_text: str | None = None,
    dims: config.TinyDims = config.DIMS,
) -> None:
    """Write `tensors` as a checkpoint folder (shards, index, configs, tokenizer) through a staging dir.

    `tokenizer_text` is a `tokenizer.json` (default: the tiny tokenizer); `dims` give config.json.
    """
    from safetensors.torch import save

    plan = plan_shards(tensors)
    tok_text = tokenizer.tokenizer_json() if tokenizer_text is None else tokenizer_text
    with staging_dir(out_dir) as tmp:
        weight_map: dict[str, str] = {}
        total = 0
        for shard, names in plan.items():
            atomic_write_bytes(tmp / shard, save({n: tensors[n] for n in names}, metadata={"format": "pt"}))
            for n in names:
                weight_map[n] = shard
                total += tensors[n].numel() * tensors[n].element_size()
        _write_json(tmp / INDEX, {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))})
        _write_json(tmp / "config.json", config.model_config(dims, tokenizer_text))
        _write_json(tmp / "generation_config.json", config.generation_config(tokenizer_text))
        _write_json(tmp / "preprocessor_config.json", config.preprocessor_config(dims))
        _write_json(tmp / "video_preprocessor_config.json", config.video_preprocessor_config(dims))
        _write_json(tmp / "tokenizer_config.json", tokenizer.tokenizer_config(tokenizer_text))
        atomic_write_bytes(tmp / "tokenizer.json", tok_text.encode())


def constant_token_id() -> int:
    """The token id the `constant` variant always predicts (`tokenizer.CONSTANT_WORD`)."""
    return tokenizer.token_ids()["constant"]


def read_index(checkpoint: Path) -> dict[str, str]:
    """tensor name -> shard file, from the checkpoint's index."""
    return read_weight_map(checkpoint) or {}
