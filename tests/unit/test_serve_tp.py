"""Memory plan per GPU under vLLM tensor parallelism, against hand-computed figures for the real
Qwen3.8-27B config (src/qwenquant/data/qwen3_8-27b.config.json).

Every expected number is a literal with its derivation beside it (not computed by the code under
test). Shape: H=5120, I=17408, V=248320, 64 layers (16 full attention, 48 GDN), 24 q / 4 kv heads
of 256 with output gate, GDN 16 key / 48 value heads of 128, conv kernel 4, one MTP layer.
One-GPU figures (tests/unit/test_plan_budget.py): embeddings 2,542,796,800; int4 lm_head
655,564,800 (2,640 B per vocab row: 2,560 packed + 80 scales); int4 body 12,543,590,400;
MTP 849,398,784; other bf16 52,476,928.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qwenquant.errors import UsageError
from qwenquant.plan.artifact import make_plan
from qwenquant.plan.budget import CacheSettings, GiB, cache_model, make_budget
from qwenquant.plan.gpumem import parse_size
from qwenquant.plan.weights import (
    QuantSettings,
    model_shape,
    tp_bytes,
    tp_problem,
    weights_from_config,
    weights_from_tensors,
)
from qwenquant.recipe import load_recipe

REAL = Path(__file__).resolve().parents[2] / "src/qwenquant/data/qwen3_8-27b.config.json"
SINGLE_USER = CacheSettings("auto", "float16", "align", 3)  # the recipe's single-user profile


@pytest.fixture(scope="module")
def shape():
    return model_shape(json.loads(REAL.read_text()))


@pytest.fixture(scope="module")
def quant():
    return QuantSettings.from_recipe(load_recipe("w4a16-int4head").canonical())


def test_weights_per_gpu_tp2(shape, quant):
    w = weights_from_config(shape, quant, tp=2)
    b = w.bytes
    # vocab 248320 is already a multiple of 64 (3880 x 64): 124,160 rows per GPU x 5120 x 2 B
    assert b["embeddings"] == 1_271_398_400
    # 124,160 rows x 2,640 B
    assert b["lm_head"] == 327_782_400
    # every body Linear split in two (4 KV heads: 2 per GPU, so k/v halve too): 12,543,590,400 / 2
    assert b["int4_body"] == 6_271_795_200
    # MTP: norms replicated (pre_fc_norm_embedding/hidden, norm 3 x 10,240; q/k norm 1,024; 2 layer norms
    #   20,480 = 52,224); the rest (849,398,784 - 52,224 = 849,346,560, fc included) halves: 424,673,280
    assert b["mtp"] == 424_725_504  # 424,673,280 + 52,224
    # other bf16: replicated norms 64*2*5120*2 = 1,310,720 + q/k 16,384 + GDN norm 48*128*2 = 12,288 + final
    #   10,240 = 1,349,632; split: GDN 48 * (in_proj_a,b 983,040 + conv1d 81,920 + dt_bias 96 + A_log 96)
    #   = 51,127,296 / 2 = 25,563,648
    assert b["other_bf16"] == 26_913_280  # 1,349,632 + 25,563,648
    # 1,271,398,400 + 6,271,795,200 + 327,782,400 + 424,725,504 + 26,913,280
    assert w.loaded() == 8_322_614_784


def test_weights_tp1_unchanged(shape, quant):
    assert weights_from_config(shape, quant).loaded() == 16_643_827_712
    assert weights_from_config(shape, quant, tp=1).bytes == weights_from_config(shape, quant).bytes


def test_kv_heads_replicated_beyond_their_count(shape):
    # tp 8 > 4 KV heads: each GPU holds 1 head (a quarter), not an eighth; k_proj int4 2,703,360 B
    assert tp_bytes("model.language_model.layers.3.self_attn.k_proj.weight_packed", 2_703_360, shape, 8) == 675_840
    assert tp_bytes("model.language_model.layers.3.self_attn.q_proj.weight_packed", 32_440_320, shape, 8) == 4_055_040
    assert tp_bytes("model.language_model.layers.3.input_layernorm.weight", 10_240, shape, 8) == 10_240
    c = cache_model(shape, SINGLE_USER, tp=8)
    assert c.kv_bytes_per_token_layer == 1_024  # 2 x 1 head x 256 x 2 B


def test_weights_from_artifact_tensors_per_gpu(shape):
    """The artifact path applies the same rules by tensor name (multimodal layout names)."""
    w = weights_from_tensors(
        {
            "model.language_model.embed_tokens.weight": 2_542_796_800,
            "lm_head.weight_packed": 635_699_200,
            "lm_head.weight_scale": 19_865_600,
            "model.language_model.layers.0.mlp.down_proj.weight_packed": 44_564_480,
            "model.language_model.layers.0.mlp.down_proj.weight_shape": 16,
            "mtp.pre_fc_norm_hidden.weight": 10_240,
            "mtp.fc.weight": 104_857_600,
        },
        shape,
        2,
    )
    # embeddings and lm_head as in test_weights_per_gpu_tp2; down_proj halves, weight_shape replicated
    assert w.bytes["embeddings"] == 1_271_398_400 and w.bytes["lm_head"] == 327_782_400
    assert w.bytes["int4_body"] == 22_282_256  # 44,564,480 / 2 + 16
    assert w.bytes["mtp"] == 52_439_040  # 10,240 + 104,857,600 / 2


def test_caches_per_gpu_tp2(shape):
    c = cache_model(shape, SINGLE_USER, tp=2)
    # KV: 2 x (4 / 2 = 2 heads) x 256 x 2 B = 2,048 per layer x (16 + 1 MTP) layers
    assert c.kv_bytes_per_token == 34_816
    # conv (10240 / 2) x (4 - 1 + 3 spec) x 2 B = 61,440; ssm (48 / 2) x 128 x 128 x 2 B = 786,432
    assert (c.conv_state_bytes, c.ssm_state_bytes) == (61_440, 786_432)
    assert c.gdn_state_bytes_per_seq == 203_489_280  # 48 layers x 847,872 x 5 slots (align: 2 + 3)
    # block 16 x ceil(847,872 / (16 x 2,048)) = 16 x 26 = 416 tokens; page 416 x 2,048 = 851,968
    assert (c.block_tokens, c.page_bytes, c.group_size, c.attn_groups, c.gdn_groups) == (416, 851_968, 17, 1, 3)


def test_budget_2x24gib_single_user(shape, quant):
    b = make_budget(
        shape,
        weights_from_config(shape, quant, tp=2),
        SINGLE_USER,
        device="cuda",
        total_bytes=24 * GiB,
        utilization=0.92,
        max_model_len=32768,
        max_num_seqs=1,
        max_num_batched_tokens=2048,
        tp=2,
    )
    # vLLM's profiling peak, the head's transient counted whole on each GPU (an upper bound: 248320 x 5120 x 2 =
    #   2,542,796,800) + the fitted constant int(0.2334 GiB) = 250,611,341 (measured on one GPU, not divided)
    assert b.activation_bytes == 2_793_408_141
    # int(24 GiB x 0.92) = 23,708,219,473 - 8,322,614,784 - 2,793,408,141 - 816,043,785 (runtime)
    assert b.cache_available == 11_776_152_763
    # floor(11,776,152,763 / (17 x 851,968 = 14,483,456)) = 813 blocks - 1 null = 812: 8 sequences of 79 + 15 blocks
    assert b.fits and b.concurrency == 8
    assert b.largest_len(1) == 331_552  # (812 - 15 GDN (3 groups x 5)) x 416


def test_plan_command_tp2_matches(tmp_path):
    res = make_plan(REAL, parse_size("24GiB"), tp=2)
    assert res.weights.loaded() == 8_322_614_784
    assert res.budgets["single-user"].largest_len(1) == 331_552 and res.budgets["single-user"].tp == 2


def test_unsplittable_gpu_count_refused(shape):
    assert tp_problem(shape, 2) is None and tp_problem(shape, 8) is None
    assert "GDN key heads 16" in tp_problem(shape, 3)
    with pytest.raises(UsageError, match="tensor-parallel size 3 does not divide"):
        make_plan(REAL, parse_size("24GiB"), tp=3)


@pytest.mark.parametrize(
    "command, line, names_entry",
    [
        (["vllm", "--tensor-parallel-size", "2"], "CUDA error: an illegal memory access was encountered", True),
        (["vllm", "--tensor-parallel-size=2"], "CUDA error: an illegal memory access was encountered", True),
        (["vllm", "--tensor-parallel-size", "2", "-tp", "1"], "CUDA error: an illegal memory access", False),
        (["vllm"], "CUDA error: an illegal memory access was encountered", False),
        (["vllm", "--tensor-parallel-size", "2"], "torch.OutOfMemoryError: CUDA out of memory", False),
    ],
)
def test_fatal_hint_names_the_tensor_parallel_entry(command, line, names_entry):
    """The hint `serve` prints after a fatal line before ready: only a tensor-parallel server that
    hit an illegal memory access is sent to its known-issues entry."""
    from qwenquant.serve.failure import fatal_hint

    hint = fatal_hint(command, ["(Worker_TP1 pid=7) ERROR WorkerProc hit an exception.", line])
    assert hint.startswith("read the log above; the server is stopped")
    assert ("docs/known-issues.md#tensor-parallel-illegal-memory-access" in hint) is names_entry
