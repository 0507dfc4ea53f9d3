"""Tensor and module names of the Qwen3.5 checkpoint layout, and the compressed-tensors targets for them."""

from __future__ import annotations

import re
from collections.abc import Iterable

MTP_PREFIX = "mtp."  # the 15 tensors of the MTP draft head (transformers drops them on load)
MTP_IGNORE = "re:^mtp.*"  # quantization_config.ignore entry that keeps the MTP head bf16
LM_PREFIX = "model.language_model."  # the text model inside the multimodal layout
VISION_PREFIX = "model.visual."
# matches `lm_head` (HF) and `language_model.lm_head` (vLLM); a bare "lm_head" is not remapped by vLLM
LM_HEAD_TARGET = "re:.*lm_head$"


def is_mtp(name: str) -> bool:
    """Is `name` a tensor or module of the MTP head (`mtp.*`, also under a `model.` prefix)?"""
    return name.startswith(MTP_PREFIX) or f".{MTP_PREFIX}" in name


def target_matches(entry: str, module: str) -> bool:
    """compressed-tensors / vLLM matching of a target or ignore entry: `re:` is re.match, anything
    else equality (an invalid regex matches nothing)."""
    if entry.startswith("re:"):
        try:
            return re.match(entry[3:], module) is not None
        except re.error:
            return False
    return entry == module


def targets_cover(entries: Iterable[str], module: str) -> bool:
    """Does any entry match `module`?"""
    return any(target_matches(e, module) for e in entries)
