"""The value types of the vLLM version table (interface shared by serve's launch decision, doctor, check, eval)."""

from __future__ import annotations

from dataclasses import dataclass

BUILDS = ("cuda", "cpu")
INT8_ROUTES = ("marlin-env", "humming", "none")
HOST_EMBEDDINGS = ("run", "read", "unchecked", "no")


@dataclass(frozen=True)
class Hazard:
    """One known upstream problem that touches our artifacts, and what qwenquant does about it."""

    key: str  # stable id, e.g. "mtp-prompt-logprobs"
    upstream: str  # "vllm #53488" (issue/PR/RFC reference)
    summary: str  # one line: what goes wrong for our users
    guard: str  # one line: what qwenquant does about it


@dataclass(frozen=True)
class CompatRow:
    """What one range of vLLM releases (one build) does with qwenquant's artifacts."""

    build: str  # "cuda" | "cpu"
    versions: str  # the range as text, e.g. ">=0.34.0" or "0.26.x"
    lowest: str  # inclusive lower bound, "0.26.0"
    highest: str | None  # inclusive upper bound, "0.26.99"; None = open ended
    archs: frozenset[str]  # architectures served: "Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration"
    mtp_text_only: bool  # MTP drafting for the text-only layout works
    quantized_mtp: bool  # an int4 MTP head loads
    max_spec_tokens: int | None  # more draft tokens crash the GDN path (None: no limit known)
    int8_activations: str  # "marlin-env" (VLLM_MARLIN_INPUT_DTYPE=int8) | "humming" | "none"
    int8_int4_head: bool  # that int8 route keeps an int4 lm_head / int4 MTP head working
    marlin_env_refused: bool  # vLLM refuses to start when VLLM_MARLIN_INPUT_DTYPE is set at all
    pp_with_mtp: bool  # pipeline parallelism with MTP drafting is supported
    marlin_pads_rows: bool  # Marlin zero-pads weights to a valid tile (in_proj_a/b rule is quality-only)
    hazards: tuple[Hazard, ...]
    # the host-embeddings plugin (scripts/vllm-host-embeddings/plugin) on this range: "run" (served with it),
    # "read" (every vLLM function and class it uses read in the release named in the table's notes), "unchecked",
    # or "no" (not available: the CPU build has no device memory to save)
    host_embeddings: str = "unchecked"


@dataclass(frozen=True)
class RowMatch:
    """The row `row_for` picked for a version, and the line to print when the table had to guess."""

    row: CompatRow
    version: str | None
    newer_than_table: bool  # the version is above every row: the newest row's guards apply
    warning: str | None  # the line to print then (None otherwise)
    older_than_table: bool = False  # the version is below every row: the oldest row's guards apply, untested
