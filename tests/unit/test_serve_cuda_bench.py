"""benchmarks/serve_cuda_bench.py's log parsing and comparison (pure), on vLLM's log line formats
(vllm/v1/worker/gpu_worker.py, gpu_model_runner.py, v1/core/kv_cache_utils.py, v1/engine/core.py,
utils/mem_utils.py) with the figures seen on an H200 with vLLM 0.26.0."""

from __future__ import annotations

import pytest

from benchmarks import serve_cuda_bench as bench

LOG = """\
(EngineCore_DP0 pid=4242) INFO 11-30 10:01:02 [gpu_model_runner.py:4400] Model loading took 5.4 GiB memory and 41.512345 seconds
(EngineCore_DP0 pid=4242) DEBUG 11-30 10:02:50 [gpu_worker.py:330] Memory profiling takes 104.12 seconds. Total non KV cache memory: 8.41GiB; torch peak memory increase: 2.51GiB; total consumed (from mem_get_info): 6.2GiB; weights memory: 5.4GiB.
(EngineCore_DP0 pid=4242) INFO 11-30 10:02:50 [gpu_worker.py:345] Available KV cache memory: 15.5 GiB
(EngineCore_DP0 pid=4242) INFO 11-30 10:02:51 [kv_cache_utils.py:1300] GPU KV cache size: 1,226,351 tokens
(EngineCore_DP0 pid=4242) INFO 11-30 10:02:51 [kv_cache_utils.py:1305] Maximum concurrency for 32,768 tokens per request: 37.43x
(EngineCore_DP0 pid=4242) INFO 11-30 10:05:10 [gpu_model_runner.py:5100] Graph capturing finished in 31 secs, took 0.46 GiB
(EngineCore_DP0 pid=4242) INFO 11-30 10:05:11 [core.py:250] init engine (profile, create kv cache, warmup model) took 256.80 seconds
"""


def test_parses_vllm_figures():
    got = bench.parse_vllm_log(LOG)
    assert got == {
        "weights_gib": 5.4,
        "weights_load_s": 41.512345,
        "kv_available_gib": 15.5,
        "kv_tokens": 1226351,
        "max_concurrency": 37.43,
        "max_concurrency_len": 32768,
        "cuda_graph_gib": 0.46,
        "peak_activation_gib": 2.51,
        "non_kv_gib": 8.41,
        "engine_init_s": 256.8,
    }


def test_newer_formats_and_missing_lines():
    log = (
        "INFO [core.py:403] init engine (profile, create kv cache, warmup model) took 12.50 s (compilation: 3.00 s)\n"
        "INFO [gpu_worker.py:972] CUDA graph pool memory: 0.44 GiB (actual), 0.5 GiB (estimated), difference: "
        "0.06 GiB (13.6%).\n"
    )
    assert bench.parse_vllm_log(log) == {"engine_init_s": 12.5, "cuda_graph_pool_gib": 0.44, "cuda_graph_gib": 0.44}
    assert bench.parse_vllm_log("nothing here") == {}


def test_compare_flags_more_than_five_percent():
    rows = {
        r["figure"]: r
        for r in bench.compare(
            {"weights_gib": 5.5, "kv_available_gib": 15.0, "kv_tokens": 1000},
            {"weights_gib": 5.4, "kv_available_gib": 15.5},
        )
    }
    assert rows["weights_gib"]["diff_pct"] == pytest.approx(1.85, abs=0.01) and not rows["weights_gib"]["flag"]
    assert rows["kv_available_gib"]["diff_pct"] == pytest.approx(-3.23, abs=0.01)
    assert rows["kv_tokens"]["vllm"] is None and rows["kv_tokens"]["diff_pct"] is None
    rows = bench.compare({"weights_gib": 6.0}, {"weights_gib": 5.4})
    assert rows[0]["flag"] and "> 5%" in bench.table("single-user", rows)
