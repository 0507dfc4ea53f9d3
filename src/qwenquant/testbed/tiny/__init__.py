"""Deterministic tiny Qwen3.5 checkpoints (the real model's Hugging Face layout, a few MB)."""

from __future__ import annotations

from qwenquant.testbed.tiny.build import VARIANTS, build_tiny_checkpoint, constant_token_id

__all__ = ["VARIANTS", "build_tiny_checkpoint", "constant_token_id"]
