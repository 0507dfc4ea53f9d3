"""The vLLM CPU plugin's dense path (scripts/vllm-cpu/plugin) and serve's reading of which path runs.

The dequantization is held against compressed-tensors' own decompressor (the one transformers loads
an artifact with), on packed weights made by compressed-tensors' packer: codes, scales and the
rounding to bfloat16 must be the same bytes. vLLM itself is not importable here; the plugin's vLLM
half runs in tests/integration/test_cpu_w4a16_fallback.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from qwenquant.errors import UsageError
from qwenquant.modeling import compat
from qwenquant.serve.cpupath import SWITCH, decide, switch_env

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "vllm-cpu" / "plugin"))
from qwenquant_vllm_cpu import dense


def _packed_module(out_f: int, in_f: int, group: int, seed: int = 0) -> tuple[dict[str, torch.Tensor], dict]:
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(-8, 8, (out_f, in_f), generator=g, dtype=torch.int8)
    scales = (torch.rand(out_f, in_f // group, generator=g) * 0.02 + 1e-4).to(torch.bfloat16)
    packed = {
        "weight_packed": compat.pack_int32(codes, 4),
        "weight_scale": scales,
        "weight_shape": torch.tensor([out_f, in_f]),
    }
    group_cfg = compat.weight_scheme(
        ["Linear"], num_bits=4, symmetric=True, group_size=group, actorder=None, observer="minmax"
    )
    return packed, group_cfg


@pytest.mark.parametrize("out_f, in_f, group", [(64, 256, 128), (96, 128, 32), (32, 64, 64)])
def test_dense_weight_equals_compressed_tensors_decompression(out_f: int, in_f: int, group: int) -> None:
    packed, group_cfg = _packed_module(out_f, in_f, group)
    want = compat.unpack_group(packed, group_cfg).to(torch.bfloat16)
    codes = dense.unpack_int4(packed["weight_packed"], packed_dim=1)
    got = dense.dense_weight(codes, packed["weight_scale"], group, torch.bfloat16, bias=8)
    assert got.dtype == torch.bfloat16 and got.shape == (out_f, in_f)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))


def test_unpack_reads_the_nibbles_lowest_first_along_either_dimension() -> None:
    word = torch.tensor([[0x76543210, -0x789ABCDF]], dtype=torch.int32)  # 0x87654321 as int32
    assert dense.unpack_int4(word, 1).tolist() == [[0, 1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4, 5, 6, 7, 8]]
    assert dense.unpack_int4(word.t(), 0).t().tolist() == dense.unpack_int4(word, 1).tolist()


def test_zero_points_replace_the_fixed_offset() -> None:
    codes = torch.tensor([[0, 15, 7, 8]])
    scales = torch.tensor([[0.5, 2.0]])
    w = dense.dense_weight(codes, scales, 2, torch.float32, zero_points=torch.tensor([[1, 8]]))
    assert w.tolist() == [[-0.5, 7.0, -2.0, 0.0]]
    assert dense.dense_weight(codes, scales, 2, torch.float32).tolist() == [[-4.0, 3.5, -2.0, 0.0]]


def test_a_shape_that_does_not_match_its_groups_is_refused() -> None:
    with pytest.raises(ValueError, match="do not match group size 32"):
        dense.dense_weight(torch.zeros(4, 64, dtype=torch.int32), torch.ones(4, 3), 32, torch.bfloat16)


@pytest.mark.parametrize(
    "info, forced, path, why",
    [
        ({"plugin": True, "path": "dense", "why": "forced by X"}, True, "dense", "forced by X"),
        ({"plugin": True, "path": "kernel", "why": "_C.abi3.so registers it"}, False, "kernel", "registers it"),
        ({"plugin": False, "has_op": True, "cpu_avx512": True}, False, "kernel", "plugin is not installed"),
        ({"plugin": False, "has_op": False, "cpu_avx512": False}, False, "none", "this CPU has no AVX-512"),
        ({"plugin": False, "has_op": True, "cpu_avx512": True}, True, "none", f"{SWITCH}=dense is set"),
    ],
)
def test_the_path_follows_the_plugin_and_says_why(info: dict, forced: bool, path: str, why: str) -> None:
    p = decide(info, forced)
    assert p.path == path and why in p.why
    assert p.line().startswith("vLLM CPU W4A16 path: ")


def test_the_switch_is_checked_before_it_reaches_vllm() -> None:
    assert switch_env({}) == {} and switch_env({SWITCH: "auto"}) == {}
    assert switch_env({SWITCH: "dense"}) == {SWITCH: "dense"}
    with pytest.raises(UsageError, match=f"{SWITCH} must be auto or dense, got 'fast'"):
        switch_env({SWITCH: "fast"})
