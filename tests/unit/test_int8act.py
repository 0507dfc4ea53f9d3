"""The int8-activation simulation (evaluate/int8act.py) on tiny tensors: vLLM's per-token int8 rounding,
its int16 re-quantization of the group scales, and the integer matmul."""

from __future__ import annotations

import pytest
import torch

from qwenquant.evaluate.int8act import (
    Int8ActLinear,
    fused_name,
    int8_act_matmul,
    int16_scales,
    quantize_tokens,
    round_half_away,
    swap_linears,
)


def test_ties_round_away_from_zero() -> None:
    v = torch.tensor([0.5, 1.5, 2.5, -0.5, -2.5, 0.49, -1.51, 3.0])
    assert round_half_away(v).tolist() == [1.0, 2.0, 3.0, -1.0, -3.0, 0.0, -2.0, 3.0]


def test_a_known_vector_rounds_to_its_int8_codes() -> None:
    # absmax 2.0: a = 2 / 127; x * 63.5 = [127, 31.75, -63.5, 0.254, -127]
    q, a = quantize_tokens(torch.tensor([[2.0, 0.5, -1.0, 0.004, -2.0]]))
    assert q.tolist() == [[127.0, 32.0, -64.0, 0.0, -127.0]]
    assert a.item() == pytest.approx(2.0 / 127)


def test_an_all_zero_token_keeps_the_floor_scale() -> None:
    q, a = quantize_tokens(torch.zeros(2, 4))
    assert q.abs().sum() == 0 and torch.all(a == torch.tensor(1e-10) / 127)


def test_a_scale_below_max_over_8192_becomes_zero() -> None:
    s = torch.tensor([[1.0, 1 / 4096, 1 / 8192, 0.9 / 8192, 1.1 / 8192]], dtype=torch.bfloat16)
    s16, g = int16_scales(s)
    assert s16.dtype == torch.int16
    # 4096 * s / max: 4096, 1, 0.5 (a tie: rounds to even, 0), 0.45, 0.55
    assert s16.tolist() == [[4096, 1, 0, 0, 1]]
    assert g == 1 / 4096


def test_scales_are_divided_by_the_max_in_their_own_dtype() -> None:
    """bf16 keeps 8 significant bits: s / max is rounded there before the int16 rounding."""
    s = torch.tensor([[3.0, 2.9]], dtype=torch.bfloat16)
    s16, _ = int16_scales(s)
    want = (s / s.max() * 4096).round().to(torch.int16)
    assert torch.equal(s16, want) and s16.tolist() != [[4096, round(2.9 / 3 * 4096)]]


def _exact_case() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    g = torch.Generator().manual_seed(0)
    codes = torch.randint(-8, 8, (6, 64), generator=g, dtype=torch.int8)
    scales = 2.0 ** -torch.randint(0, 6, (6, 2), generator=g).to(torch.bfloat16)  # exact in int16 of the max
    q = torch.randint(-127, 128, (5, 64), generator=g).float()
    q[:, 0] = 127  # every token reaches its absmax: x is exactly on its int8 grid
    x = q * (torch.arange(1, 6).float().unsqueeze(1) / 8)
    return x, codes, scales, 32


def test_equals_the_w4a16_result_when_activations_and_scales_are_representable() -> None:
    x, codes, scales, gs = _exact_case()
    s16, glob = int16_scales(scales)
    y, overflow = int8_act_matmul(x, codes, s16, glob, gs)
    w = (codes.float().unflatten(-1, (-1, gs)) * scales.float().unsqueeze(-1)).flatten(-2)
    assert overflow == 0
    assert torch.allclose(y, x @ w.T, rtol=1e-6, atol=1e-6)


def test_differs_from_w4a16_by_the_int8_rounding_of_the_input() -> None:
    x, codes, scales, gs = _exact_case()
    x = x + 0.01  # off the grid
    s16, glob = int16_scales(scales)
    y, _ = int8_act_matmul(x, codes, s16, glob, gs)
    q, a = quantize_tokens(x)
    w = (codes.float().unflatten(-1, (-1, gs)) * scales.float().unsqueeze(-1)).flatten(-2)
    assert torch.allclose(y, (q * a) @ w.T, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(y, x @ w.T, rtol=1e-5, atol=1e-5)


def test_a_zeroed_group_drops_its_weights() -> None:
    codes = torch.full((1, 64), 3, dtype=torch.int8)
    scales = torch.tensor([[1.0, 1 / 10000]], dtype=torch.bfloat16)
    s16, glob = int16_scales(scales)
    y, _ = int8_act_matmul(torch.ones(1, 64), codes, s16, glob, 32)
    assert y.item() == pytest.approx(3 * 32 * 1.0)  # the second group's 32 x 3 x 1e-4 is gone


def test_an_int32_overflow_is_counted() -> None:
    codes = torch.full((1, 8192), -8, dtype=torch.int8)
    s16, glob = int16_scales(torch.ones(1, 64, dtype=torch.bfloat16))
    _, overflow = int8_act_matmul(torch.ones(3, 8192), codes, s16, glob, 128)
    assert overflow == 3  # 8192 x 127 x 8 x 4096 > 2^31


def test_fused_layers_share_one_name() -> None:
    assert fused_name("model.layers.3.self_attn.k_proj") == "model.layers.3.self_attn.qkv_proj"
    assert fused_name("mtp.layers.0.mlp.up_proj") == "mtp.layers.0.mlp.gate_up_proj"
    assert fused_name("model.layers.0.linear_attn.in_proj_z") == "model.layers.0.linear_attn.in_proj_qkvz"
    assert (
        fused_name("model.layers.0.linear_attn.in_proj_a") == "model.layers.0.linear_attn.in_proj_ba"
    )  # as vLLM fuses
    assert fused_name("lm_head") == "lm_head"


def test_swap_replaces_only_the_named_linears() -> None:
    root = torch.nn.Module()
    root.mlp = torch.nn.Module()
    root.mlp.down_proj = torch.nn.Linear(64, 6, bias=False)
    root.mlp.gate = torch.nn.Linear(64, 6, bias=False)
    x, codes, scales, gs = _exact_case()
    s16, glob = int16_scales(scales)
    lin = Int8ActLinear(codes, s16, glob, gs)
    assert swap_linears(root, {"mtp.mlp.down_proj": lin}, prefix="mtp.") == ["mtp.mlp.down_proj"]
    assert root.mlp.down_proj is lin and isinstance(root.mlp.gate, torch.nn.Linear)
    assert torch.equal(root.mlp.down_proj(x), int8_act_matmul(x, codes, s16, glob, gs)[0])


def test_fused_members_take_their_scales_relative_to_the_fused_layers_max() -> None:
    """q/k/v are one Marlin layer in vLLM: k_proj's scales are re-quantized against q_proj's larger max."""
    from qwenquant.evaluate.int8act import int8_modules
    from qwenquant.modeling.compat import pack_int32

    codes = torch.randint(-8, 8, (4, 64), generator=torch.Generator().manual_seed(1), dtype=torch.int8)
    group = {
        "targets": ["Linear"],
        "weights": {"num_bits": 4, "symmetric": True, "strategy": "group", "group_size": 32},
    }
    tensors = {}
    for name, top in (("q_proj", 1.0), ("k_proj", 1 / 16), ("o_proj", 1 / 16)):
        tensors.update(
            {
                f"layers.0.self_attn.{name}.weight_packed": pack_int32(codes, 4),
                f"layers.0.self_attn.{name}.weight_shape": torch.tensor([4, 64]),
                f"layers.0.self_attn.{name}.weight_scale": torch.full((4, 2), top, dtype=torch.bfloat16),
            }
        )
    mods = int8_modules(tensors, {"quantization_config": {"config_groups": {"group_0": group}}})
    assert torch.equal(mods["layers.0.self_attn.q_proj"].codes, codes)
    assert mods["layers.0.self_attn.k_proj"].s16.unique().tolist() == [256]  # 4096 / 16, global max/4096 = q's
    assert mods["layers.0.self_attn.k_proj"].global_scale == 1 / 4096
    assert mods["layers.0.self_attn.o_proj"].s16.unique().tolist() == [4096]  # its own layer
