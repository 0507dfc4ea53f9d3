"""Would vLLM load this artifact? Rules over config.json, the shard index and safetensors headers.

No tensor data is read except each quantized Linear's 2-element `weight_shape` (and, for the int8-activations
rule of `check --activations int8`, the group scales: check/activations.py); no torch.
`read_artifact` gathers the facts (thin, touches files); every rule is a pure function
`rule(ArtifactFacts) -> list[Finding]`, so tests feed it small fixtures.

Names are matched as stored in the checkpoint (`model.language_model.*` or `model.*`), with
compressed-tensors' semantics: a `re:` entry is `re.match`, anything else equality, and the
class target `Linear` matches every Linear except lm_head (vLLM's ParallelLMHead is not one).

Split by concern: `facts` (reading the artifact into `ArtifactFacts`, the finding types), `rules`
(the tensor rules, the table of every rule and `run_rules`), `quant_config_rule` (quantization_config itself),
`layout_rules` (text prefix, mrope, vision tower) and `mtp_rule` (the MTP head's rule). Import from
`qwenquant.check`.
"""

from __future__ import annotations

from pathlib import Path

from qwenquant.check.facts import (
    FLOAT_DTYPES,
    IGNORED,
    MULTIMODAL_ARCH,
    PACKED_SUFFIXES,
    TEXT_ONLY_ARCH,
    ArtifactFacts,
    CheckReport,
    Finding,
    read_artifact,
)
from qwenquant.check.layout_rules import rule_layout, rule_no_mrope, rule_vision
from qwenquant.check.mtp_rule import MTP_LAYER, MTP_TOP, rule_mtp
from qwenquant.check.mtp_vllm import QUANTIZED_MTP_VLLM, mtp_vllm_problems, quantized_mtp_vllm_problem
from qwenquant.check.quant_config_rule import rule_quant_config
from qwenquant.check.rules import (
    FUSED_PARTS,
    RULE_FUNCS,
    RULES,
    rule_fused_scheme,
    rule_kernel_shape,
    rule_lm_head,
    rule_packed_format,
    rule_scheme_storage,
    run_rules,
)

__all__ = [
    "FLOAT_DTYPES",
    "FUSED_PARTS",
    "IGNORED",
    "MTP_LAYER",
    "MTP_TOP",
    "MULTIMODAL_ARCH",
    "PACKED_SUFFIXES",
    "QUANTIZED_MTP_VLLM",
    "RULES",
    "RULE_FUNCS",
    "TEXT_ONLY_ARCH",
    "ArtifactFacts",
    "CheckReport",
    "Finding",
    "check_artifact",
    "mtp_vllm_problems",
    "quantized_mtp_vllm_problem",
    "read_artifact",
    "rule_fused_scheme",
    "rule_kernel_shape",
    "rule_layout",
    "rule_lm_head",
    "rule_mtp",
    "rule_no_mrope",
    "rule_packed_format",
    "rule_quant_config",
    "rule_scheme_storage",
    "rule_vision",
    "run_rules",
]


def check_artifact(artifact_dir: Path) -> CheckReport:
    """Check an artifact against what vLLM's loader needs; `report.ok` when nothing would be refused."""
    return run_rules(read_artifact(Path(artifact_dir)), str(artifact_dir))
