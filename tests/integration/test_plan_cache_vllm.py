"""The KV cache paging `qwenquant plan` counts (qwenquant.plan.budget.cache_model) against vLLM's own functions,
called through .venv-vllm's python (vLLM is not importable from the quantization environment) by
tests/integration/vllm_cache_layout.py, for the 27B shape (data/qwen3_8-27b.config.json: 16 full-attention + 48 GDN
layers, + the MTP drafter's attention layer when the profile drafts) and the shipped profiles' cache settings
(single-user: bf16 KV + MTP k=3; batch: fp8 KV, no MTP; long-context-max: fp8 KV + MTP k=3), after the device rules
(plan/settings.py cache_settings: on CPU an MTP profile runs without prefix caching, so GDN mode none).

What vLLM 0.32 computes, per case (file:line in vllm 0.32.0):
- the attention block size and the GDN page padding: Platform.update_block_size_for_backend
  (platforms/cpu.py:533 on CPU, platforms/interface.py:750 for CUDA's rule) -> _align_hybrid_block_size
  (platforms/interface.py:939), with the GDN state from Qwen3_5ForConditionalGeneration
  .get_mamba_state_shape_from_config / .get_mamba_state_dtype_from_config (model_executor/models/qwen3_5.py:620, :609)
  and `--mamba-ssm-cache-dtype auto` resolved by Qwen3_5ForConditionalGenerationConfig.verify_and_update_config
  (model_executor/models/config.py:853);
- the layer specs as Attention.get_kv_cache_spec and MambaBase.get_kv_cache_spec build them (FullAttentionSpec,
  MambaSpec: v1/kv_cache_interface.py:578, :1035), the grouping get_kv_cache_groups (v1/core/kv_cache_utils.py:2159
  -> unify_kv_cache_spec_page_size :1292, _get_kv_cache_groups_uniform_page_size :1362), the pool block
  _get_kv_cache_bytes_per_block (:1520), the pool get_kv_cache_config_from_groups (:1588) and the concurrency vLLM
  logs, get_max_concurrency_for_kv_cache_config (:1195), with MambaSpec.max_memory_usage_bytes
  (kv_cache_interface.py:1076) counting 2 + k state blocks per request in mode align and 1 + k in mode none;
- the `--max-model-len auto` fit and the start-up check, both in get_kv_cache_configs (:2531 -> _auto_fit_max_model_len
  :2414, _check_enough_kv_cache_memory :1003, over _estimate_max_model_len_from_groups :2369 and
  _max_memory_usage_bytes_from_groups :2337).

The backend a server discovers from its built layers is named instead: CPU_ATTN on CPU (its kernels take multiples
of 32 tokens and the CPU platform's block is 128, platforms/cpu.py:293, so the hybrid block is a multiple of 128 as
the plan assumes; its only KV layout, LBHNC, is not block-outermost, so no packed groups), FLASH_ATTN for CUDA
(multiples of 16). Mode none's GDN block size is max_model_len (MambaModelConfig,
model_executor/models/config.py:709). vLLM 0.32 moved the hybrid block rule from HybridAttentionMambaModelConfig
(0.26, model_executor/models/config.py) to the platform (_align_hybrid_block_size); the rule is the same: for the
long-context-max settings in mode none it gives CUDA vLLM 0.26's logged 832-token block and 281 pool blocks of
8,160,000,000 B (tests/unit/test_plan_budget.py,
test_cache_model_against_what_cuda_vllm_026_logged_for_long_context_max).

vLLM's null block (v1/core/block_pool.py:187): 0.32 keeps it out of the auto fit and the start-up check
(kv_cache_utils.py:2627, "Reserve the null block BlockPool permanently holds back"), as the plan's usable_blocks
does, so the plan's largest length and its `fits` are vLLM 0.32's exactly. CUDA vLLM 0.26 counted it (its 223,808
fitted tokens are one 832-token block more than 0.32 gives for the same pool; test_plan_budget.py pins 0.26's).
The concurrency vLLM logs still divides every block, the null block included; the plan's counts the usable ones.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from qwenquant import data_path
from qwenquant.plan.budget import CacheModel, CacheSettings, GiB, cache_model
from qwenquant.plan.settings import cache_settings
from qwenquant.plan.weights import model_shape
from qwenquant.recipe import load_recipe

from helpers import require_vllm

REPO = Path(__file__).resolve().parents[2]
INFO = REPO / ".venv-vllm" / "qwenquant-vllm.json"
SCRIPT = Path(__file__).with_name("vllm_cache_layout.py")
CONFIG = data_path("qwen3_8-27b.config.json")
SHAPE = model_shape(json.loads(CONFIG.read_text()))
RECIPE = "w4a16-int4head-multimodal"
PROFILES = ("single-user", "batch", "long-context-max")
AVAILABLE = {"cpu": 8 * GiB, "cuda": 8_160_000_000}  # a VLLM_CPU_KVCACHE_SPACE; vLLM 0.26's logged KV bytes

pytestmark = [pytest.mark.vllm]


def _case(device: str, settings: CacheSettings, max_model_len: int, tp: int = 1) -> dict:
    return {
        "tp": tp,
        "device": device,
        "kv_cache_dtype": settings.kv_cache_dtype,
        "mamba_ssm_cache_dtype": settings.mamba_ssm_cache_dtype,
        "mamba_cache_mode": settings.mamba_cache_mode,
        "num_speculative_tokens": settings.num_speculative_tokens,
        "max_model_len": max_model_len,
        "available_memory": AVAILABLE[device],
        "starts": _start_lengths(cache_model(SHAPE, settings, tp), AVAILABLE[device], max_model_len),
    }


def _start_lengths(c: CacheModel, available: int, max_model_len: int) -> list[int]:
    """Lengths to ask vLLM's start-up check about: the profile's, the plan's largest and one token more."""
    largest = c.max_len_for(available, 1)
    return [max_model_len, largest, largest + 1]


def _profile_cases() -> list[tuple[str, str, CacheSettings, int]]:
    recipe = load_recipe(RECIPE)
    out = []
    for device in ("cpu", "cuda"):
        for name in PROFILES:
            prof = recipe.profile(name)
            out.append((device, name, cache_settings(prof, device, "multimodal"), prof.max_model_len))
    return out


def _vllm_layouts(cases: list[dict]) -> list[dict]:
    require_vllm(INFO, f"the vLLM environment ({INFO})")
    python = json.loads(INFO.read_text())["python"]
    arg = json.dumps({"config": str(CONFIG), "cases": cases})
    proc = subprocess.run([python, str(SCRIPT), arg], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _check(c: CacheModel, v: dict, max_model_len: int, available: int) -> None:
    """The plan's CacheModel against one layout vLLM built."""
    assert v["block_size"] == c.block_tokens
    assert v["attn_page_1_token"] == c.kv_bytes_per_token_layer
    assert v["attn_page"] == v["gdn_page"] == c.page_bytes  # the GDN page padded to the attention page
    assert v["gdn_state_bytes"] == c.conv_state_bytes + c.ssm_state_bytes
    attn = [g for g in v["groups"] if g["kind"] == "attention"]
    gdn = [g for g in v["groups"] if g["kind"] == "gdn"]
    assert (len(attn), len(gdn)) == (c.attn_groups, c.gdn_groups)
    assert max(g["layers"] for g in v["groups"]) == c.group_size
    assert sum(g["layers"] for g in attn) == c.n_attn_layers and sum(g["layers"] for g in gdn) == c.n_linear_layers
    assert v["bytes_per_block"] == c.block_bytes
    assert {g["blocks_per_request"] for g in gdn} == {c.slots_per_seq}
    assert sum(g["blocks_per_request"] for g in v["groups"]) == c.seq_blocks(max_model_len)
    blocks = v["num_blocks"]
    assert blocks == available // c.block_bytes and c.usable_blocks(available) == blocks - 1  # vLLM's null block
    assert v["max_concurrency"] == pytest.approx(blocks / c.seq_blocks(max_model_len))
    # vLLM 0.32 fits and checks over the usable blocks, as the plan does (0.26 counted the null block too)
    assert v["auto_fit"] == c.max_len_for(available, 1)
    assert v["auto_fit"] == (blocks - 1 - c.gdn_groups * c.slots_per_seq) // c.attn_groups * c.block_tokens
    lengths = _start_lengths(c, available, max_model_len)
    assert v["starts"] == [c.usable_blocks(available) >= c.seq_blocks(n) for n in lengths]  # Budget.fits
    assert v["starts"][1:] == [True, False]


def test_plan_paging_matches_vllms_for_the_shipped_profiles():
    cases = _profile_cases()
    layouts = _vllm_layouts([_case(device, s, n) for device, _, s, n in cases])
    for (device, name, settings, max_model_len), v in zip(cases, layouts, strict=True):
        c = cache_model(SHAPE, settings)
        try:
            _check(c, v, max_model_len, AVAILABLE[device])
        except AssertionError as e:
            raise AssertionError(f"{device} {name} {settings}: vLLM {v}, plan {c}") from e
    by = {(device, name): (s, v) for (device, name, s, _), v in zip(cases, layouts, strict=True)}
    # the figures themselves, so a change on either side shows here
    assert [by["cpu", n][1]["block_size"] for n in PROFILES] == [512, 896, 896]
    assert [by["cuda", n][1]["block_size"] for n in PROFILES] == [416, 800, 832]
    assert [by["cpu", n][0].mamba_cache_mode for n in PROFILES] == ["none", "align", "none"]  # MTP on CPU: none


def test_cuda_rule_gives_vllm_026s_logged_long_context_max():
    """vLLM 0.26 on CUDA ran long-context-max in GDN mode none (prefix caching off) and logged an 832-token block,
    281 blocks of 8,160,000,000 B and 223,808 fitted tokens; 0.32's functions give the same block and pool, and a
    fit one block shorter (0.32 reserves the null block, as the plan does)."""
    prof = load_recipe(RECIPE).profile("long-context-max")
    settings = replace(cache_settings(prof, "cuda", "multimodal"), mamba_cache_mode="none")
    (v,) = _vllm_layouts([_case("cuda", settings, prof.max_model_len)])
    c = cache_model(SHAPE, settings)
    _check(c, v, prof.max_model_len, AVAILABLE["cuda"])
    # 0.26 fitted 223,808 = (281 - 3 x 4) x 832 over every block; 0.32 keeps the null block out: one block less
    assert (v["block_size"], v["num_blocks"], v["auto_fit"]) == (832, 281, 223_808 - 832)


def test_ssm_cache_dtype_auto_is_the_configs_mamba_ssm_dtype():
    """`--mamba-ssm-cache-dtype auto` on Qwen3.5 is the config's mamba_ssm_dtype (float32 on the 27B), as the plan
    assumes, not the model dtype the generic GDN rule would give."""
    settings = CacheSettings("fp8", "auto", "align", 0, block_align=128)
    (v,) = _vllm_layouts([_case("cpu", settings, 4096)])
    assert v["ssm_dtype"] == "float32"
    _check(cache_model(SHAPE, settings), v, 4096, AVAILABLE["cpu"])


def test_tensor_parallel_pages_match_vllms():
    """Under tensor parallelism of 2 every figure is per GPU: vLLM's GDN state shape with tp_world_size 2 (conv
    channels and SSM heads halved) and 2 of the 4 KV heads per GPU (ModelConfig.get_num_kv_heads' max(1, heads //
    tp), given to the script as a rule, not called) against cache_model(..., tp=2)."""
    recipe = load_recipe(RECIPE)
    cases = [(name, cache_settings(recipe.profile(name), "cuda", "multimodal")) for name in ("single-user", "batch")]
    layouts = _vllm_layouts([_case("cuda", s, recipe.profile(n).max_model_len, tp=2) for n, s in cases])
    for (name, settings), v in zip(cases, layouts, strict=True):
        _check(cache_model(SHAPE, settings, tp=2), v, recipe.profile(name).max_model_len, AVAILABLE["cuda"])
