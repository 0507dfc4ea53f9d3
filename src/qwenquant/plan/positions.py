"""The one rule on a profile's context length that does not depend on memory: vLLM refuses a
max_model_len above the model's max_position_embeddings unless VLLM_ALLOW_LONG_MAX_MODEL_LEN is set.
`qwenquant plan` marks such a profile as not fitting and serve's preflight refuses it (exit 7). Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

ALLOW_LONG = "VLLM_ALLOW_LONG_MAX_MODEL_LEN"


def position_limit(config: Mapping[str, Any]) -> int | None:
    """The model's max_position_embeddings (text_config's for a multimodal config), None when absent."""
    text = config.get("text_config")
    limit = (text if isinstance(text, Mapping) else config).get("max_position_embeddings")
    return limit if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0 else None


def long_allowed(env: Mapping[str, str]) -> bool:
    """vLLM serves past max_position_embeddings when VLLM_ALLOW_LONG_MAX_MODEL_LEN is 1 or true."""
    return env.get(ALLOW_LONG, "").strip().lower() in ("1", "true")


def position_problem(config: Mapping[str, Any], max_model_len: int, env: Mapping[str, str]) -> str | None:
    """Why vLLM would refuse `max_model_len` for this model, or None (within the limit, or allowed)."""
    limit = position_limit(config)
    if limit is None or max_model_len <= limit or long_allowed(env):
        return None
    return f"max-model-len {max_model_len} is above the model's max_position_embeddings {limit}"


def position_fix(config: Mapping[str, Any]) -> str:
    """What to do about it (the hint of the refusal)."""
    return (
        f"pass `-- --max-model-len {position_limit(config)}` (or less), or set {ALLOW_LONG}=1 to serve "
        "positions the model was never trained on"
    )
