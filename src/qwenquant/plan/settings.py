"""What vLLM will really run with (pure): the recipe a manifest records, the artifact's layout, and
a serve profile's settings after the device rules. The memory plan and serve's argv both read them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from qwenquant.plan.budget import CacheSettings
from qwenquant.recipe import Recipe, ResolvedProfile

DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192  # vLLM's default when the profile leaves it unset


@dataclass(frozen=True)
class Decided:
    """Settings after device rules: what vLLM will really run with."""

    enforce_eager: bool
    prefix_caching: bool | None  # None: vLLM's default (on)
    mamba_cache_mode: str | None  # what we pass; None: not passed
    effective_mamba_cache_mode: str  # what vLLM uses (for the memory plan)
    num_speculative_tokens: int
    max_num_batched_tokens: int
    language_model_only: bool


def manifest_recipe(manifest: Any) -> Mapping[str, Any]:
    """The recipe dict recorded in a manifest (Manifest object or plain dict)."""
    rec = manifest.get("recipe") if isinstance(manifest, Mapping) else getattr(manifest, "recipe", None)
    return rec or {}


def artifact_layout(manifest: Any) -> str:
    return str(manifest_recipe(manifest).get("artifact", {}).get("layout", "text-only"))


def recipe_from_manifest(manifest: Any) -> Recipe:
    """The Recipe recorded in a manifest.

    The canonical dict writes every unset serve setting as null, and Recipe.profile() treats a
    key that is present as set, so nulls are dropped first (null means "not set" in serve settings).
    """
    d = json.loads(json.dumps(manifest_recipe(manifest)))
    serve = d.get("serve") or {}
    for section in [serve.get("defaults") or {}, *(serve.get("profiles") or {}).values()]:
        for k in [k for k, v in section.items() if v is None]:
            del section[k]
    return Recipe.model_validate(d)


def decide(profile: ResolvedProfile, device: str, layout: str) -> Decided:
    """Apply the device rules (CPU: eager; MTP on CPU: no prefix caching, docs/known-issues.md#cpu-prefix-caching)."""
    spec = profile.speculative.num_speculative_tokens if profile.speculative else 0
    eager = bool(profile.enforce_eager) or device == "cpu"
    prefix = profile.enable_prefix_caching
    if device == "cpu" and spec:
        prefix = False  # Triton-only kernel otherwise on the first request
    mode = profile.mamba_cache_mode
    if prefix is False:
        mode = None  # vLLM resets align/all to none without prefix caching
    return Decided(
        enforce_eager=eager,
        prefix_caching=prefix,
        mamba_cache_mode=mode,
        effective_mamba_cache_mode=mode or ("none" if prefix is False else "align"),
        num_speculative_tokens=spec,
        max_num_batched_tokens=profile.max_num_batched_tokens or DEFAULT_MAX_NUM_BATCHED_TOKENS,
        language_model_only=layout == "multimodal",
    )


def cache_settings(profile: ResolvedProfile, device: str, layout: str) -> CacheSettings:
    """The profile settings the caches depend on, after the device rules."""
    d = decide(profile, device, layout)
    return CacheSettings(
        profile.kv_cache_dtype,
        profile.mamba_ssm_cache_dtype,
        d.effective_mamba_cache_mode,
        d.num_speculative_tokens,
        block_align=128 if device == "cpu" else 16,
    )
