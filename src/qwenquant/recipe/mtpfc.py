"""The int4 grouping of `mtp.fc` (pure): its input is [embedding ; hidden], 2H wide (docs/known-issues.md#vllm-versions,
hazard mtp-fc-grouping).

A channelwise scale spans both halves; the hidden half's larger values set it and the embedding half rounds to zero:
0% draft acceptance, no error (seen in a public project with the same head shape). A group that straddles column H
does the same to the columns it holds. Group-wise scales with a group size dividing H keep every group inside one
half. Shared by the recipe rules (exit 2), `check` (exit 6) and so quantize's check stage.
"""

from __future__ import annotations

# The hidden size of Qwen3.8-27B, the model the shipped recipes are for (data/qwen3_8-27b.config.json; a test holds
# it equal): a recipe names no model, so its mtp.fc grouping is judged on this one; check uses the artifact's own.
RECIPE_HIDDEN = 5120


def mtp_fc_grouping_problem(strategy: object, group_size: object, hidden: int) -> str | None:
    """None when an int4 `mtp.fc` quantized with `strategy`/`group_size` keeps each scale group inside one half of
    its [embedding ; hidden] input (2 x `hidden` columns), else the sentence saying what goes wrong."""
    if strategy in ("channel", "tensor") or not isinstance(group_size, int) or group_size <= 0:
        what = f"strategy {strategy}" if strategy in ("channel", "tensor") else "no group_size (channelwise)"
        return (
            f"{what} quantizes mtp.fc with one scale per row across its [embedding ; hidden] input "
            f"({2 * hidden} columns): the embedding half rounds to zero and MTP accepts nothing, with no error"
        )
    if hidden % group_size:
        col = hidden // group_size * group_size
        return (
            f"group_size {group_size} puts mtp.fc's group of columns {col}-{col + group_size - 1} across column "
            f"{hidden}, where its input turns from the embedding to the hidden state (hidden_size {hidden}): that "
            "group's scale rounds its embedding columns to zero and MTP acceptance collapses, with no error"
        )
    return None


def mtp_fc_grouping_fix(hidden: int) -> str:
    return f"use a group_size dividing hidden_size {hidden} (128 does), or keep the MTP head bf16 (mtp.quantize: bf16)"
