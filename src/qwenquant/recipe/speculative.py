"""How many MTP draft tokens vLLM's Gated DeltaNet speculative path survives (pure).

More than 4 draft tokens crash vLLM's GDN spec-decode path under load (an illegal memory access in
the GDN attention metadata, FlashInfer's GDN kernel handles at most 4: vllm #37035, open in
2026-12; the fix needs flashinfer #2679). No vLLM release is known to fix it, so the limit holds
for every version until `SPEC_TOKENS_FIXED_IN` names one.
"""

from __future__ import annotations

from typing import Any

SPEC_TOKENS_LIMIT = 4
SPEC_TOKENS_DEFAULT = 3  # what the shipped recipes draft
SPEC_TOKENS_ISSUE = "vllm #37035"


def spec_tokens_problem(n: int | None, vllm_version: str | None = None, limit: int = SPEC_TOKENS_LIMIT) -> str | None:
    """None when `n` draft tokens are within `limit` (a release's, from the version table), else the sentence
    saying why not."""
    if not n or n <= limit:
        return None
    where = f"vLLM {vllm_version}" if vllm_version else "vLLM"
    return (
        f"num_speculative_tokens {n} is above {limit}: {where}'s Gated DeltaNet speculative path "
        f"crashes with more than {limit} draft tokens ({SPEC_TOKENS_ISSUE})"
    )


def spec_tokens_fix() -> str:
    return (
        f"draft at most {SPEC_TOKENS_LIMIT} tokens (the recipes draft {SPEC_TOKENS_DEFAULT}): "
        f'set speculative.num_speculative_tokens, or pass --speculative-config \'{{"method": "mtp", '
        f'"num_speculative_tokens": {SPEC_TOKENS_DEFAULT}}}\' after --'
    )


def profile_spec_tokens(serve: Any) -> dict[str, int]:
    """Draft tokens per profile of a recipe's `serve` mapping (as a manifest records it), profiles
    without speculation left out; tolerant of any shape (a malformed manifest is reported elsewhere)."""
    if not isinstance(serve, dict):
        return {}
    defaults = serve.get("defaults")
    if not isinstance(defaults, dict):
        defaults = {}
    out: dict[str, int] = {}
    profiles = serve.get("profiles")
    if not isinstance(profiles, dict):
        profiles = {}
    for name, prof in profiles.items():
        if not isinstance(prof, dict):
            continue
        spec = prof["speculative"] if "speculative" in prof else defaults.get("speculative")
        n = spec.get("num_speculative_tokens") if isinstance(spec, dict) else None
        if isinstance(n, int) and n > 0:
            out[str(name)] = n
    return out
