"""The committed trained reference model (package data) and its checkpoint-folder layout.

`qwenquant/data/tiny-reference/` holds what `python scripts/train_reference.py` (a checkout's) wrote: bf16 weights of
the text model and the MTP head, the tokenizer, the held-out evaluation windows, reference.json and
SHA256SUMS (checked on every load). `build_reference_checkpoint` lays it out like the random
builder: two body shards + index + model-mtp.safetensors, configs, tokenizer, and a seeded random
vision tower (never trained; the text path does not use it) so the multimodal layout is complete.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

# the committed files themselves are read in checkpoint/tinyref.py (evaluate reads the held-out windows there)
from qwenquant.checkpoint.tinyref import data_dir, heldout_ids, reference_meta, reference_tensors, verified_bytes

if TYPE_CHECKING:
    import torch

VISION_SEED = 0
__all__ = [
    "VISION_SEED",
    "build_reference_checkpoint",
    "data_dir",
    "heldout_ids",
    "reference_dims",
    "reference_meta",
    "reference_tensors",
    "verified_bytes",
    "vision_tensors",
]


def reference_dims(folder: Path | None = None) -> Any:
    """The model's `TinyDims`."""
    from qwenquant.testbed.tiny.config import TinyDims

    return TinyDims(**reference_meta(folder)["dims"])


def vision_tensors(dims: Any, seed: int = VISION_SEED) -> dict[str, torch.Tensor]:
    """Seeded random bf16 vision-tower tensors for `dims` (the tiny builder's value recipe)."""
    import torch

    from qwenquant.testbed.tiny import weights

    gen = torch.Generator().manual_seed(seed)
    specs = sorted(weights._vision(dims), key=lambda s: s.name)
    return {s.name: weights._draw(s, gen).to(torch.bfloat16).contiguous() for s in specs}


def build_reference_checkpoint(out_dir: Path, folder: Path | None = None) -> Path:
    """Write the committed reference model as a Qwen3.5 checkpoint folder into `out_dir`; return it.

    Same files as `build_tiny_checkpoint` (config.json, tokenizer, processor configs, two bf16 body
    shards + index, model-mtp.safetensors), same bytes on every run.
    """
    from qwenquant.testbed.tiny.build import write_checkpoint

    dims = reference_dims(folder)
    tensors = {**reference_tensors(folder), **vision_tensors(dims)}
    tok_text = verified_bytes("tokenizer.json", folder).decode()
    out_dir = Path(out_dir)
    write_checkpoint(out_dir, tensors, tok_text, dims)
    return out_dir
