"""The vLLM command line for each profile and device (exact lists), overrides, and key masking."""

from __future__ import annotations

import pytest

from qwenquant.errors import ServeError
from qwenquant.recipe import load_recipe
from qwenquant.serve.argv import apply_extra, build_vllm_argv, build_vllm_env, format_command, mask_argv

ART = "/srv/artifacts/q27b"


@pytest.fixture(scope="module")
def recipe():
    return load_recipe("w4a16-int4head")


def manifest(recipe, layout="text-only"):
    rec = recipe.canonical()
    rec["artifact"]["layout"] = layout
    return {"recipe": rec}


COMMON = ["--model", ART, "--served-model-name", "qwen3.8-27b-w4a16", "--host", "127.0.0.1", "--port", "8000"]
MTP = '{"method":"mtp","num_speculative_tokens":3}'


def test_single_user_cuda(recipe):
    argv = build_vllm_argv(ART, recipe.profile("single-user"), manifest(recipe), "cuda")
    assert argv == COMMON + [
        "--max-model-len", "32768", "--max-num-seqs", "1", "--max-num-batched-tokens", "2048",
        "--gpu-memory-utilization", "0.92", "--kv-cache-dtype", "auto", "--mamba-ssm-cache-dtype", "float16",
        "--mamba-cache-mode", "align", "--reasoning-parser", "qwen3", "--speculative-config", MTP,
    ]


def test_batch_cuda(recipe):
    argv = build_vllm_argv(ART, recipe.profile("batch"), manifest(recipe), "cuda")
    assert argv == COMMON + [
        "--max-model-len", "16384", "--max-num-seqs", "16", "--max-num-batched-tokens", "2048",
        "--gpu-memory-utilization", "0.92", "--kv-cache-dtype", "fp8", "--mamba-ssm-cache-dtype", "float16",
        "--mamba-cache-mode", "align", "--reasoning-parser", "qwen3",
    ]


def test_single_user_cpu(recipe):
    """CPU: eager, no GPU utilization; MTP turns prefix caching off, so no mamba cache mode either."""
    argv = build_vllm_argv(ART, recipe.profile("single-user"), manifest(recipe), "cpu")
    assert argv == COMMON + [
        "--max-model-len", "32768", "--max-num-seqs", "1", "--max-num-batched-tokens", "2048",
        "--kv-cache-dtype", "auto", "--mamba-ssm-cache-dtype", "float16", "--reasoning-parser", "qwen3",
        "--speculative-config", MTP, "--enforce-eager", "--no-enable-prefix-caching",
    ]


def test_batch_cpu(recipe):
    argv = build_vllm_argv(ART, recipe.profile("batch"), manifest(recipe), "cpu")
    assert argv == COMMON + [
        "--max-model-len", "16384", "--max-num-seqs", "16", "--max-num-batched-tokens", "2048",
        "--kv-cache-dtype", "fp8", "--mamba-ssm-cache-dtype", "float16", "--mamba-cache-mode", "align",
        "--reasoning-parser", "qwen3", "--enforce-eager",
    ]


def test_multimodal_layout_serves_language_model_only(recipe):
    argv = build_vllm_argv(ART, recipe.profile("batch"), manifest(recipe, "multimodal"), "cuda")
    assert argv[-1] == "--language-model-only"


def test_profiles_differ_where_they_should(recipe):
    single = build_vllm_argv(ART, recipe.profile("single-user"), manifest(recipe), "cuda")
    batch = build_vllm_argv(ART, recipe.profile("batch"), manifest(recipe), "cuda")
    assert "--speculative-config" in single and "--speculative-config" not in batch


def test_extra_flags_replace_profile_flags(recipe):
    argv = build_vllm_argv(ART, recipe.profile("single-user"), manifest(recipe), "cuda",
                           ["--max-model-len", "8192", "--gdn-prefill-backend=triton"])
    assert argv.count("--max-model-len") == 1
    assert argv[-3:] == ["--max-model-len", "8192", "--gdn-prefill-backend=triton"]


def test_extra_overrides_reach_the_plan(recipe):
    p = apply_extra(recipe.profile("single-user"), ["--max-model-len=8192", "--max-num-seqs", "2"])
    assert (p.max_model_len, p.max_num_seqs) == (8192, 2)
    with pytest.raises(ServeError, match="--max-num-seqs"):
        apply_extra(recipe.profile("single-user"), ["--max-num-seqs", "many"])


def test_api_key_is_passed_but_masked(recipe):
    argv = build_vllm_argv(ART, recipe.profile("batch"), manifest(recipe), "cuda", api_key="s3cret")
    assert argv[-2:] == ["--api-key", "s3cret"]
    assert mask_argv(argv)[-2:] == ["--api-key", "****"]
    assert mask_argv(["--api-key=s3cret"]) == ["--api-key=****"]
    shown = format_command(["vllm", "serve", *argv], {"VLLM_CPU_KVCACHE_SPACE": "1"})
    assert "s3cret" not in shown and shown.startswith("VLLM_CPU_KVCACHE_SPACE=1 vllm serve --model")


def test_cpu_env(recipe):
    assert build_vllm_env("cpu", {}) == {"VLLM_CPU_KVCACHE_SPACE": "1"}
    assert build_vllm_env("cpu", {"VLLM_CPU_KVCACHE_SPACE": "4"}) == {}
    assert build_vllm_env("cuda", {}) == {}


@pytest.mark.parametrize("profiles", [["single-user", "batch"], []])
def test_exactly_one_profile(profiles, tmp_path):
    """single-user and batch are mutually exclusive; one --profile is required."""
    from qwenquant.serve.run import run_serve

    with pytest.raises(ServeError, match="choose exactly one --profile"):
        run_serve(tmp_path, profiles, [], port=None, host=None, api_key=None, served_model_name=None, vllm=None,
                  dry_run=True, timeout=1, device=None, log_file=None)


def test_unknown_device(recipe):
    with pytest.raises(ServeError, match="unknown device"):
        build_vllm_argv(ART, recipe.profile("batch"), manifest(recipe), "tpu")
