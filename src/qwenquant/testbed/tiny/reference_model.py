"""The committed trained reference model (package data) and its checkpoint-folder layout.

`qwenquant/data/tiny-reference/` holds what `python scripts/train_reference.py` (a checkout's) wrote: bf16 weights of
the text model and the MTP head, the tokenizer, the held-out evaluation windows, reference.json and
SHA256SUMS (checked on every load). `build_reference_checkpoint` lays it out like the random
builder: two body shards + index + model-mtp.safetensors, configs, tokenizer, and a seeded random
vision tower (never trained; the text path does not use it) so the multimodal layout is complete.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qwenquant import data_path
from qwenquant.errors import QwenquantError

if TYPE_CHECKING:
    import torch

VISION_SEED = 0


def data_dir() -> Path:
    """Folder of the committed reference model inside the installed package."""
    return data_path("tiny-reference")


def verified_bytes(name: str, folder: Path | None = None) -> bytes:
    """Bytes of one committed file, after checking them against SHA256SUMS."""
    folder = data_dir() if folder is None else Path(folder)
    sums = {}
    for line in (folder / "SHA256SUMS").read_text().splitlines():
        digest, _, fname = line.partition("  ")
        sums[fname] = digest
    data = (folder / name).read_bytes()
    if sums.get(name) != hashlib.sha256(data).hexdigest():
        raise QwenquantError(
            f"{folder / name} does not match its sha256 in {folder / 'SHA256SUMS'}",
            hint="reinstall qwenquant, or retrain in a checkout: `python scripts/train_reference.py --out DIR`",
        )
    return data


def reference_meta(folder: Path | None = None) -> dict[str, Any]:
    """reference.json: dims, corpus digest, training settings and the figures measured at training."""
    return json.loads(verified_bytes("reference.json", folder))


def reference_tensors(folder: Path | None = None) -> dict[str, torch.Tensor]:
    """The trained bf16 tensors (text model, lm_head, mtp.*) under checkpoint names."""
    from safetensors.torch import load

    return load(verified_bytes("model.safetensors", folder))


def heldout_ids(folder: Path | None = None) -> torch.Tensor:
    """The fixed held-out evaluation windows [N, L] (int64), from stdlib modules never trained on."""
    from safetensors.torch import load

    return load(verified_bytes("heldout.safetensors", folder))["input_ids"].long()


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
