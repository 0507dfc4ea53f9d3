"""The recipe's serve section: vLLM settings, named profiles and a profile resolved against the defaults."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from qwenquant.recipe.strict import StrictModel as _Strict
from qwenquant.recipe.strict import field_error as _fail


class SpeculativeSpec(_Strict):
    """vLLM `--speculative-config`; MTP uses the checkpoint's own draft head."""

    method: Literal["mtp"] = "mtp"
    num_speculative_tokens: int

    @field_validator("num_speculative_tokens")
    @classmethod
    def _n(cls, v: int) -> int:
        if v < 1:
            raise _fail(f"must be at least 1 for method mtp, got {v} — use 1-3, or set speculative: null")
        return v


class ServeSettings(_Strict):
    """vLLM settings; every key optional so a profile overrides only what it names."""

    served_model_name: str | None = None
    host: str | None = None
    port: int | None = Field(default=None, ge=1, le=65535)
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16"] | None = None
    mamba_ssm_cache_dtype: Literal["auto", "float16", "bfloat16", "float32"] | None = None
    mamba_cache_mode: str | None = None
    reasoning_parser: str | None = None
    tool_call_parser: str | None = None  # vLLM --tool-call-parser (with --enable-auto-tool-choice)
    tool_strict_level: Literal["auto", "function", "parameter"] | None = None  # vLLM >= 0.31
    max_num_batched_tokens: int | None = Field(default=None, gt=0)
    speculative: SpeculativeSpec | None = None
    max_model_len: int | None = Field(default=None, gt=0)
    max_num_seqs: int | None = Field(default=None, gt=0)
    gpu_memory_utilization: float | None = None
    enforce_eager: bool | None = None
    enable_prefix_caching: bool | None = None
    extra_args: list[str] | None = None
    # vLLM's Marlin activations: int8 sets VLLM_MARLIN_INPUT_DTYPE=int8 for the server (serve/activations.py)
    activations: Literal["bf16", "int8"] | None = None
    # the input embedding table in pinned host memory, read through UVA (scripts/vllm-host-embeddings/plugin)
    host_embeddings: bool | None = None
    # vLLM's KV cache sized by qwenquant's plan (--kv-cache-memory-bytes) instead of vLLM's profiling run, whose
    # activation peak (2.48 GiB measured with vLLM 0.26) a served request does not reach (benchmarks/RESULTS.md)
    kv_cache_from_plan: bool | None = None

    @field_validator("gpu_memory_utilization")
    @classmethod
    def _gmu(cls, v: float | None) -> float | None:
        if v is not None and not 0 < v <= 1:
            raise _fail(f"must be in (0, 1], got {v} — it is the fraction of GPU memory vLLM may use")
        return v


class ServeProfile(ServeSettings):
    description: str = ""


class ResolvedProfile(_Strict):
    """serve.defaults merged with one profile: every setting decided."""

    name: str
    description: str
    served_model_name: str
    host: str
    port: int
    kv_cache_dtype: str
    mamba_ssm_cache_dtype: str
    mamba_cache_mode: str | None
    reasoning_parser: str | None
    tool_call_parser: str | None
    tool_strict_level: str | None
    max_num_batched_tokens: int | None
    speculative: SpeculativeSpec | None
    max_model_len: int
    max_num_seqs: int
    gpu_memory_utilization: float
    enforce_eager: bool
    enable_prefix_caching: bool | None  # None: vLLM's default
    extra_args: list[str]
    activations: Literal["bf16", "int8"] = "bf16"
    host_embeddings: bool = False
    kv_cache_from_plan: bool = False


_RESOLVED_DEFAULTS: dict[str, Any] = {
    "served_model_name": "qwenquant",
    "host": "127.0.0.1",
    "port": 8000,
    "kv_cache_dtype": "auto",
    "mamba_ssm_cache_dtype": "auto",
    "mamba_cache_mode": None,
    "reasoning_parser": None,
    "tool_call_parser": None,
    "tool_strict_level": None,
    "max_num_batched_tokens": None,
    "speculative": None,
    "enforce_eager": False,
    "enable_prefix_caching": None,
    "extra_args": [],
    "activations": "bf16",
    "host_embeddings": False,
    "kv_cache_from_plan": False,
}
_PROFILE_REQUIRED = ("max_model_len", "max_num_seqs", "gpu_memory_utilization")


DEFAULT_VLLM_VERSIONS = (">=0.26.0",)  # serve.vllm_versions when a recipe leaves it out


class ServeSpec(_Strict):
    vllm_versions: list[str] = Field(default_factory=lambda: list(DEFAULT_VLLM_VERSIONS))
    defaults: ServeSettings = Field(default_factory=ServeSettings)
    profiles: dict[str, ServeProfile]

    @field_validator("vllm_versions")
    @classmethod
    def _specs(cls, v: list[str]) -> list[str]:
        try:
            from packaging.specifiers import InvalidSpecifier, SpecifierSet
        except ImportError:  # packaging comes with transformers; without it skip the syntax check
            return v
        bad = []
        for s in v:
            try:
                SpecifierSet(s)
            except InvalidSpecifier:
                bad.append(s)
        if bad:
            raise _fail(f"not PEP 440 version specifiers: {bad} — write e.g. '>=0.26.0'")
        return v
