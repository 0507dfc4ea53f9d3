"""Target matching with compressed-tensors / vLLM semantics, for recipe rules and `check`
(defined in checkpoint/names.py, beside the names it matches, so lower layers use the same one)."""

from __future__ import annotations

from qwenquant.checkpoint.names import LM_HEAD_TARGET, target_matches, targets_cover

__all__ = ["LM_HEAD_TARGET", "target_matches", "targets_cover"]
