"""The committed tiny reference model's files (package data, `qwenquant/data/tiny-reference/`), each checked
against SHA256SUMS as it is read: what eval needs of it (the tokenizer's bytes, the held-out windows) and what
the demo's builder (testbed/tiny/reference_model.py) lays out as a checkpoint."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qwenquant import data_path
from qwenquant.errors import QwenquantError

if TYPE_CHECKING:
    import torch


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
