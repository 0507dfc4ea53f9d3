"""Which vLLM releases load a quantized MTP head for Qwen3.5 (docs/known-issues.md#quantized-mtp).

vLLM builds the drafter (`Qwen3_5MTP`) with the checkpoint's own quantization config: `mtp.fc` and the
MTP decoder layer's Linears are quantized exactly when the config's targets match them and its ignore
list does not (names as stored, `mtp.fc`, `mtp.layers.0.self_attn.q_proj`, ...). Read in the source of
the 0.26 line and of 0.32.0 (served here by the CPU build). A release that forces `mtp.fc` unquantized for
compressed-tensors (the change proposed in vLLM #53414 for #53387) would refuse the packed `fc`; until a
newer release is checked, only the checked range is accepted. Pure: no vLLM import.
"""

from __future__ import annotations

from typing import Any

QUANTIZED_MTP_VLLM = ">=0.26.0,<0.33"
# Versions outside the checked range that a recipe's serve.vllm_versions must not admit.
_OUTSIDE = ("0.25.0", "0.33.0", "0.34.0", "1.0.0")
HINT = ("serve an int4-MTP artifact with vLLM 0.26-0.32 (its MTP loader builds the quantized drafter), or use the "
        "bf16-MTP recipe (w4a16-int4head); vLLM #53387: the drafter crashes when its scheme and the MTP tensors "
        "disagree")


def quantized_mtp_vllm_problem(version: str) -> str | None:
    """None when vLLM `version` is known to load a quantized MTP head, else a problem sentence."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        v = Version(version)
    except InvalidVersion:
        return f"vLLM reports version {version!r}, which is not a PEP 440 version"
    if SpecifierSet(QUANTIZED_MTP_VLLM).contains(v, prereleases=True):
        return None
    return (f"vLLM {version} is not known to load a quantized MTP head for Qwen3.5 (checked: {QUANTIZED_MTP_VLLM}); "
            "its drafter may build mtp.fc unquantized and refuse the packed tensors")


def mtp_vllm_problems(recipe: Any) -> list[str]:
    """Problems of a recipe with `mtp: {quantize: gptq}` whose serve.vllm_versions admit a release not
    known to load a quantized MTP head (none for a bf16 head)."""
    if not recipe.mtp_quantized:
        return []
    from packaging.specifiers import SpecifierSet

    spec = SpecifierSet(",".join(recipe.serve.vllm_versions))
    bad = [v for v in _OUTSIDE if spec.contains(v, prereleases=True)]
    if not bad:
        return []
    return [f"serve.vllm_versions {recipe.serve.vllm_versions} admit vLLM {', '.join(bad)}, not known to load a "
            f"quantized MTP head — narrow them to {QUANTIZED_MTP_VLLM!r} (vLLM #53387)"]
