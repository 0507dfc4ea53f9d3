"""Memory plan arithmetic against hand-computed figures for the real Qwen3.8-27B config.

Every expected number is written out as a literal with the derivation beside it (not computed by
the code under test). Shape (reference config): hidden H=5120, MLP I=17408, vocab V=248320,
64 layers (16 full attention, 48 GDN), 24 q heads / 4 kv heads of 256 with output gate,
GDN 16 key / 48 value heads of 128, conv kernel 4, one MTP layer. Recipe: int4, group 128,
bf16 scales; in_proj_a/b, MTP and vision stay bf16; int4 lm_head group 128.
int4 Linear [out, in] = out*in/2 (packed) + out*(in/128)*2 (scales) bytes.
"""

from __future__ import annotations

import json

import pytest

from qwenquant.plan.artifact import make_plan
from qwenquant.plan.budget import CacheSettings, GiB, cache_model, make_budget
from qwenquant.plan.gpumem import parse_size
from qwenquant.plan.weights import QuantSettings, model_shape, weights_from_config, weights_from_tensors
from qwenquant.recipe import load_recipe

# The real Qwen3.8-27B config.json (reference copy), text part; vision and rope left out (unused here).
CONFIG_JSON = """
{
 "architectures": [
  "Qwen3_5ForConditionalGeneration"
 ],
 "model_type": "qwen3_5",
 "text_config": {
  "attention_bias": false,
  "attention_dropout": 0.0,
  "attn_output_gate": true,
  "eos_token_id": 248044,
  "full_attention_interval": 4,
  "head_dim": 256,
  "hidden_act": "silu",
  "hidden_size": 5120,
  "initializer_range": 0.02,
  "intermediate_size": 17408,
  "layer_types": null,
  "linear_conv_kernel_dim": 4,
  "linear_key_head_dim": 128,
  "linear_num_key_heads": 16,
  "linear_num_value_heads": 48,
  "linear_value_head_dim": 128,
  "mamba_ssm_dtype": "float32",
  "max_position_embeddings": 262144,
  "model_type": "qwen3_5_text",
  "mtp_num_hidden_layers": 1,
  "mtp_use_dedicated_embeddings": false,
  "num_attention_heads": 24,
  "num_hidden_layers": 64,
  "num_key_value_heads": 4,
  "partial_rotary_factor": 0.25,
  "rms_norm_eps": 1e-06,
  "tie_word_embeddings": false,
  "use_cache": true,
  "vocab_size": 248320
 },
 "tie_word_embeddings": false
}
"""


@pytest.fixture(scope="module")
def config() -> dict:
    return json.loads(CONFIG_JSON)


@pytest.fixture(scope="module")
def weights(config):
    recipe = load_recipe("w4a16-int4head").canonical()
    return weights_from_config(model_shape(config), QuantSettings.from_recipe(recipe))


def test_shape(config):
    s = model_shape(config)
    assert (s.n_full, s.n_linear, s.conv_dim) == (16, 48, 10240)  # conv_dim = 2*16*128 + 48*128


def test_weight_components(weights):
    b = weights.bytes
    # embeddings: V*H*2 = 248320*5120*2
    assert b["embeddings"] == 2_542_796_800
    # lm_head int4: 248320*5120/2 = 635,699,200 + scales 248320*40*2 = 19,865,600
    assert b["lm_head"] == 655_564_800 and weights.lm_head_quantized
    # body, per layer MLP: gate, up [17408,5120] and down [5120,17408] each 44,564,480 + 1,392,640
    #   = 45,957,120; x3 = 137,871,360; x64 layers = 8,823,767,040
    # full attention (x16): q [12288,5120] 31,457,280 + 983,040 = 32,440,320; k, v [1024,5120]
    #   2,621,440 + 81,920 = 2,703,360 each; o [5120,6144] 15,728,640 + 491,520 = 16,220,160;
    #   sum 54,067,200; x16 = 865,075,200
    # GDN (x48): in_proj_qkv [10240,5120] 26,214,400 + 819,200 = 27,033,600; in_proj_z [6144,5120]
    #   16,220,160; out_proj [5120,6144] 16,220,160; sum 59,473,920; x48 = 2,854,748,160
    # total 8,823,767,040 + 865,075,200 + 2,854,748,160
    assert b["int4_body"] == 12_543_590_400
    # MTP bf16: fc [5120,10240] 104,857,600 + 3 norms 30,720 + q 125,829,120 + k,v 20,971,520
    #   + o 62,914,560 + q/k norm 1,024 + MLP 3*17408*5120*2 = 534,773,760 + 2 norms 20,480
    assert b["mtp"] == 849_398_784
    # other bf16: layer norms 64*2*5120*2 = 1,310,720; q/k norms 16*2*256*2 = 16,384;
    #   GDN 48 * (in_proj_a,b 2*48*5120*2 = 983,040 + conv1d 10240*4*2 = 81,920 + dt_bias 96
    #   + A_log 96 + norm 256) = 48*1,065,408 = 51,139,584; final norm 10,240
    assert b["other_bf16"] == 52_476_928
    assert b["vision"] == 0
    # 2,542,796,800 + 12,543,590,400 + 655,564,800 + 849,398,784 + 52,476,928
    assert weights.loaded() == 16_643_827_712


def test_cache_single_user(config):
    c = cache_model(model_shape(config), CacheSettings("auto", "float16", "align", 3))
    assert c.kv_bytes_per_token == 69_632  # 2 * 4 kv heads * 256 * 2 B = 4,096 x (16 + 1 MTP) layers
    # conv 10240 * (4-1+3 spec) * 2 B = 122,880; ssm 48*128*128*2 B = 1,572,864; per layer-slot 1,695,744
    assert (c.conv_state_bytes, c.ssm_state_bytes) == (122_880, 1_572_864)
    assert c.gdn_state_bytes_per_seq == 406_978_560  # 48 layers * 1,695,744 * 5 slots (align: 2 + 3)
    # block = 16 * ceil(1,695,744 / (16*4096)) = 16 * 26 = 416 tokens; page 416*4096 = 1,703,936
    assert (c.block_tokens, c.page_bytes) == (416, 1_703_936)
    # 17 attention layers vs 48 GDN: groups of 17 -> 1 attention + 3 GDN groups (3 padding layers)
    assert (c.group_size, c.attn_groups, c.gdn_groups) == (17, 1, 3)
    # (ceil(32768/416) = 79 attention blocks + 3 groups * 5 slots) * 17 layers * 1,703,936 B
    assert c.seq_bytes(32768) == 2_722_889_728


def test_cache_batch(config):
    c = cache_model(model_shape(config), CacheSettings("fp8", "float16", "align", 0))
    assert c.kv_bytes_per_token == 32_768  # 2 * 4 * 256 * 1 B = 2,048 x 16 layers
    assert c.gdn_state_bytes_per_seq == 156_893_184  # 48 * (10240*3*2 + 1,572,864) * 2 slots
    # block = 16 * ceil(1,634,304 / 32,768) = 16 * 50 = 800; (ceil(16384/800)=21 + 3*2) * 16 * 1,638,400
    assert (c.block_tokens, c.seq_bytes(16384)) == (800, 707_788_800)


def _budget(config, weights, gib, settings, max_len, seqs):
    return make_budget(
        model_shape(config),
        weights,
        settings,
        device="cuda",
        total_bytes=gib * GiB,
        utilization=0.92,
        max_model_len=max_len,
        max_num_seqs=seqs,
        max_num_batched_tokens=2048,
    )


def test_budget_24gib(config, weights):
    b = _budget(config, weights, 24, CacheSettings("auto", "float16", "align", 3), 32768, 1)
    # vLLM's profiling peak: a head-sized bf16 transient 248320 * 5120 * 2 = 2,542,796,800 + the constant fitted to
    # vLLM's logged KV cache, int(0.2334 GiB) = 250,611,341 (tests/unit/test_plan_measured.py), whatever the chunk
    assert b.activation_bytes == 2_793_408_141 and b.profiled
    # int(24 GiB * 0.92) = 23,708,219,473 - weights 16,643,827,712 - activations - runtime 816,043,785 (0.64 + 0.12 GiB)
    assert b.cache_available == 3_454_939_835
    assert b.fits and b.concurrency == 1
    # floor(3,454,939,835 / (17*1,703,936)) = 119 blocks - 1 (vLLM's null block) - 15 GDN = 103 * 416 tokens
    assert b.largest_len(1) == 42_848
    batch = _budget(config, weights, 24, CacheSettings("fp8", "float16", "align", 0), 16384, 16)
    # no MTP head loaded (the profile does not draft): 15,794,428,928 B of weights, 4,304,338,619 left
    assert batch.weights_bytes == 15_794_428_928 and batch.cache_available == 4_304_338_619
    assert batch.concurrency == 6  # (floor(4,304,338,619 / 26,214,400) = 164 - 1 null) // 27 blocks a sequence
    assert not batch.fits_all_seqs
    assert "at most 6 full-length sequences" in batch.concurrency_message()


def test_does_not_fit_says_what_to_lower(config, weights):
    b = _budget(config, weights, 22, CacheSettings("auto", "float16", "align", 3), 32768, 1)
    # int(22 GiB * 0.92) = 21,732,534,517 - 16,643,827,712 - 2,793,408,141 - 816,043,785
    assert b.cache_available == 1_479_254_879
    assert not b.fits
    msg = b.shortfall_message()
    assert msg.startswith("max-model-len 32768 needs 2.54 GiB for KV cache and GDN state, 1.38 GiB is left")
    # floor(1,479,254,879 / 28,966,912) = 51 - 1 null - 15 = 35 blocks * 416 = 14,560 -> 14,336 (multiple of 1024)
    assert "lower --max-model-len to 14336" in msg
    # vLLM's profiling peak does not follow the chunk (the fitted constant): no --max-num-batched-tokens fix
    assert "--max-num-batched-tokens" not in msg
    # (weights + activations + runtime + 2,722,889,728) / 22 GiB = 0.9726 -> 0.98
    assert "raise --gpu-memory-utilization to 0.98" in msg


def test_plan_from_bare_config(config, tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(config))
    res = make_plan(p, parse_size("24GiB"))
    assert res.weights.loaded() == 16_643_827_712
    assert set(res.budgets) == {"single-user", "batch", "long-context", "long-context-max"}
    assert res.budgets["single-user"].cache.kv_bytes_per_token == 69_632


def test_weights_from_tensors_components():
    w = weights_from_tensors(
        {
            "model.language_model.embed_tokens.weight": 100,
            "model.layers.0.mlp.up_proj.weight_packed": 40,
            "model.layers.0.mlp.up_proj.weight_scale": 2,
            "lm_head.weight_packed": 20,
            "lm_head.weight_scale": 1,
            "mtp.fc.weight": 7,
            "model.visual.blocks.0.attn.qkv.weight": 9,
            "model.norm.weight": 3,
        }
    )
    assert w.bytes == {"embeddings": 100, "int4_body": 42, "lm_head": 21, "mtp": 7, "other_bf16": 3, "vision": 9}
    assert w.lm_head_quantized and w.loaded() == 173 and w.loaded(include_vision=True) == 182


@pytest.mark.parametrize(
    "text, n", [("24GiB", 24 * 2**30), ("24GB", 24 * 10**9), ("24", 24 * 2**30), ("512MiB", 512 * 2**20)]
)
def test_parse_size(text, n):
    assert parse_size(text) == n


def test_a_profile_longer_than_the_model_s_positions_does_not_fit_as_serve_refuses_it(tmp_path, capsys, monkeypatch):
    """max_position_embeddings 8192: the 32768 and 90112 profiles do not fit (the batch one, 4096,
    does), with the line serve's preflight refuses them with (exit 7); VLLM_ALLOW_LONG_MAX_MODEL_LEN
    lifts it in both."""
    from qwenquant import data_path
    from qwenquant.cli import main
    from qwenquant.errors import ServeError
    from qwenquant.serve.preflight import _check_context

    config = json.loads(data_path("qwen3_8-27b.config.json").read_text())
    config["text_config"]["max_position_embeddings"] = 8192
    (tmp_path / "config.json").write_text(json.dumps(config))
    monkeypatch.delenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", raising=False)
    assert main(["plan", str(tmp_path), "--json"]) == 0  # the batch profile fits
    profiles = json.loads(capsys.readouterr().out)["profiles"]
    assert {k: (p["fits"], p["position_problem"]) for k, p in profiles.items()} == {
        "batch": (True, None),
        "long-context": (False, "max-model-len 90112 is above the model's max_position_embeddings 8192"),
        "long-context-max": (False, "max-model-len 204800 is above the model's max_position_embeddings 8192"),
        "single-user": (False, "max-model-len 32768 is above the model's max_position_embeddings 8192"),
    }
    assert main(["plan", str(tmp_path), "-p", "single-user"]) == 7
    captured = capsys.readouterr()
    assert (
        "DOES NOT FIT: max-model-len 32768 is above the model's max_position_embeddings 8192, which serve refuses"
        in captured.out
    )
    plan_says = [ln for ln in captured.err.splitlines() if ln.startswith("error:")]
    assert plan_says == [
        "error: no serve profile fits: max-model-len 32768 is above the model's "
        "max_position_embeddings 8192 (profile single-user)"
    ]
    with pytest.raises(ServeError) as refused:
        _check_context(config, load_recipe("w4a16-int4head").profile("single-user"))
    assert refused.value.message in plan_says[0]
    monkeypatch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
    assert main(["plan", str(tmp_path), "-p", "single-user"]) == 0


def test_cache_model_against_what_cuda_vllm_026_logged_for_long_context_max():
    """The plan's paging against CUDA vLLM 0.26.0's own log lines for the 27B shape with long-context-max's settings
    (fp8 KV, MTP k=3), from benchmarks/reports/long_context_64layers_h100.log (no vLLM on CUDA here): "Setting
    attention block size to 832 tokens"; with `--kv-cache-memory-bytes 8160000000` vLLM fitted 223,808 tokens (281
    pool blocks of 17 x 1,703,936 B), with its profiler 169,728 (216 blocks). vLLM 0.26 ran the GDN cache in mode
    none there (prefix caching off: "Mamba cache mode is set to 'none'"), 1 + k slots per sequence and GDN group,
    and its fit counts every block, its null block included. The plan counts the align mode's 2 + k slots (an upper
    bound) and leaves the null block out: its largest length is vLLM's less 3 + 1 blocks, and a sequence of vLLM's
    fitted length needs one block more than the pool gives (docs/known-issues.md#autofit-full-prompt)."""
    from qwenquant import data_path
    from qwenquant.plan.settings import cache_settings

    config = json.loads(data_path("qwen3_8-27b.config.json").read_text())
    prof = load_recipe("w4a16-int4head-multimodal").profile("long-context-max")
    c = cache_model(model_shape(config), cache_settings(prof, "cuda", "multimodal"))
    assert c.block_tokens == 832 and c.block_bytes == 17 * 1_703_936
    assert c.gdn_groups == 3 and c.attn_groups == 1 and c.slots_per_seq == 5
    for kv_bytes, pool_blocks, vllm_tokens in ((8_160_000_000, 281, 223_808), (216 * c.block_bytes, 216, 169_728)):
        assert kv_bytes // c.block_bytes == pool_blocks
        assert vllm_tokens == (pool_blocks - c.gdn_groups * 4) * c.block_tokens  # vLLM: 1 + k slots, every block
        assert c.max_len_for(kv_bytes, 1) == vllm_tokens - (c.gdn_groups + 1) * c.block_tokens
        assert c.usable_blocks(kv_bytes) == pool_blocks - 1
