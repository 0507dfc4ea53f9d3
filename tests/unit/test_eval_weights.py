"""Which quantization config group eval dequantizes a module with: the compressed-tensors matcher
(recipe.targets), a named target before the `Linear` class group."""

from __future__ import annotations

import pytest

from qwenquant.errors import QwenquantError
from qwenquant.evaluate.weights import _group_for

BODY = {"targets": ["Linear"], "weights": {"num_bits": 4, "group_size": 128}}
HEAD = {"targets": ["re:.*lm_head$"], "weights": {"num_bits": 4, "group_size": 64}}
EXACT = {"targets": ["model.layers.0.mlp.down_proj"], "weights": {"num_bits": 8}}


def test_named_targets_win_over_the_linear_group() -> None:
    groups = {"group_0": BODY, "group_1": HEAD, "group_2": EXACT}
    assert _group_for("lm_head", groups) is HEAD
    assert _group_for("model.layers.0.mlp.down_proj", groups) is EXACT  # exact names match, as in vLLM
    assert _group_for("model.layers.1.mlp.down_proj", groups) is BODY


def test_a_module_no_group_targets_is_an_error() -> None:
    with pytest.raises(QwenquantError, match="no quantization config group targets lm_head"):
        _group_for("lm_head", {"group_1": {"targets": ["re:.*visual.*"]}})
