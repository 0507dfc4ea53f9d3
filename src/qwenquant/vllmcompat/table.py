"""The rows: what each vLLM release range does with qwenquant's artifacts (PROVISIONAL: being read).

Each fact names the release and file it was read in; docs/known-issues.md#vllm-versions is the long form.
Ranges of one build are contiguous and oldest first (tests/unit/test_vllmcompat.py holds that).
"""

from __future__ import annotations

from qwenquant.vllmcompat import hazards as hz
from qwenquant.vllmcompat.types import CompatRow

MM = "Qwen3_5ForConditionalGeneration"
TEXT = "Qwen3_5ForCausalLM"

_MTP = (hz.PROMPT_LOGPROBS, hz.PROMPT_ONE_PLUS_K, hz.PIPELINE_MTP, hz.PREFIX_CACHING_MTP, hz.SPEC_TOKENS,
        hz.MTP_FC_GROUPING)

ROWS: tuple[CompatRow, ...] = (
    CompatRow("cuda", "0.26.x", "0.26.0", "0.26.99", frozenset({MM}), mtp_text_only=False, quantized_mtp=True,
              max_spec_tokens=4, int8_activations="marlin-env", int8_int4_head=True, marlin_env_refused=False,
              pp_with_mtp=False, marlin_pads_rows=False, hazards=_MTP + (hz.TEXT_ONLY_ARCH, hz.IN_PROJ_AB_ROWS)),
    CompatRow("cuda", "0.27.x", "0.27.0", "0.27.99", frozenset({MM, TEXT}), mtp_text_only=False, quantized_mtp=True,
              max_spec_tokens=4, int8_activations="marlin-env", int8_int4_head=True, marlin_env_refused=False,
              pp_with_mtp=False, marlin_pads_rows=False, hazards=_MTP + (hz.TEXT_ONLY_ARCH, hz.IN_PROJ_AB_ROWS)),
    CompatRow("cuda", "0.28.0-0.32.x", "0.28.0", "0.32.99", frozenset({MM, TEXT}), mtp_text_only=True,
              quantized_mtp=True, max_spec_tokens=4, int8_activations="marlin-env", int8_int4_head=True,
              marlin_env_refused=False, pp_with_mtp=False, marlin_pads_rows=True, hazards=_MTP),
    CompatRow("cuda", "0.33.x", "0.33.0", "0.33.99", frozenset({MM, TEXT}), mtp_text_only=True, quantized_mtp=False,
              max_spec_tokens=4, int8_activations="marlin-env", int8_int4_head=True, marlin_env_refused=False,
              pp_with_mtp=False, marlin_pads_rows=True, hazards=_MTP + (hz.QUANTIZED_MTP_FC,)),
    CompatRow("cuda", ">=0.34.0", "0.34.0", None, frozenset({MM, TEXT}), mtp_text_only=True, quantized_mtp=False,
              max_spec_tokens=4, int8_activations="none", int8_int4_head=False, marlin_env_refused=True,
              pp_with_mtp=False, marlin_pads_rows=True,
              hazards=_MTP + (hz.QUANTIZED_MTP_FC, hz.MARLIN_ENV_REMOVED, hz.HUMMING_LM_HEAD,
                              hz.MODEL_RUNNER_V1_REMOVED)),
    CompatRow("cpu", "0.32.x", "0.32.0", "0.32.99", frozenset({MM, TEXT}), mtp_text_only=True, quantized_mtp=True,
              max_spec_tokens=4, int8_activations="none", int8_int4_head=False, marlin_env_refused=False,
              pp_with_mtp=False, marlin_pads_rows=True, hazards=_MTP + (hz.CPU_WNA16_AVX2,)),
)
