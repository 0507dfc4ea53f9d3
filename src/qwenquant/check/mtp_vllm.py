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

from qwenquant.recipe.rules import QUANTIZED_MTP_VLLM, quantized_mtp_range_problem

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
    known to load a quantized MTP head (none for a bf16 head): the rule recipe loading applies."""
    if not recipe.mtp_quantized:
        return []
    problem = quantized_mtp_range_problem(list(recipe.serve.vllm_versions))
    return [problem] if problem else []
