"""The typed parts of a `bench run` (and `compare`) report's tree, on reportpart's Part (frozen, strict,
unknown keys refused, `to_json` the keys built or read): a spread (median and range), a cell's figures and
its requests, a ladder rung, a target, the comparison, the GPU's clocks, the options and the config the
run was given; and the target of every long run (depth, soak, turns). Keys some reports lack (written
before they were added) have a default and are left out of the JSON unless given."""

from __future__ import annotations

from qwenquant.bench.parts import Acceptance, Flag, Number, Range
from qwenquant.reportpart import Part


class Figures(Part):
    """The four per-request figures (rates.FIGURES) as spreads: over a cell's requests, or as ratios A/B
    over the rounds of a comparison (None: no value to spread)."""

    wall_tok_s: Range | None
    decode_tok_s: Range | None
    ttft_s: Range | None
    prefill_tok_s: Range | None


class RoundMedians(Part):
    """Per round, the median of each figure over the round's requests (None: no value that round)."""

    wall_tok_s: list[Number | None]
    decode_tok_s: list[Number | None]
    ttft_s: list[Number | None]
    prefill_tok_s: list[Number | None]


class RequestFigures(Part):
    """One request of a cell: its four figures (None where undefined) and its counts, usage's and the
    stream's own (token ids where they came back, else events with text)."""

    wall_tok_s: Number | None
    decode_tok_s: Number | None
    ttft_s: Number | None
    prefill_tok_s: Number | None
    prompt_tokens: int
    completion_tokens: int
    first_field: str | None
    finish_reason: str | None
    text_events: int
    streamed_tokens: int
    streamed_exact: bool
    reasoning_tokens: int | None


class CellReport(Part):
    """One measured cell (prompt, sampling, thinking, concurrency): its figures over every request, their
    medians per round, the requests' counts, which field carried the first text, each request and the
    cell's cross-checks. `max_tokens`: what each request asked (absent from older reports)."""

    prompt: str
    sampling: str
    thinking: bool | None
    concurrency: int
    figures: Figures
    round_medians: RoundMedians
    requests: int
    short_requests: int
    prompt_tokens: Number | None
    completion_tokens: int
    first_text_field: dict[str, int]
    reasoning_streamed: bool
    per_request: list[RequestFigures]
    checks: list[Flag]
    max_tokens: int | None = None


class LadderRung(Part):
    """One step of the concurrency ladder: its concurrency and cell, the aggregate rate of its waves and
    its medians per round, the per-stream rates, and its waves' "queued" checks (absent from older reports)."""

    concurrency: int
    aggregate_tok_s: Range | None
    aggregate_round_medians: list[Number | None]
    per_stream_wall_tok_s: Range | None
    per_stream_decode_tok_s: Range | None
    cell: str | None = None
    checks: list[Flag] = []


class ServerInfo(Part):
    """What is known of a target's server (runner.Target.info): its configuration text, vLLM's version; with
    --serve, what qwenquant started (serve.launched's info: the artifact, profile, GPU memory, command, log)."""

    config: str | None = None
    vllm_version: str | None = None
    vllm_version_installed: str | None = None
    artifact: str | None = None
    artifact_root_digest: str | None = None
    profile: str | None = None
    gpu_mem: str | None = None
    gpu_mem_limit: str | None = None
    gpus: int | None = None
    split: str | None = None
    extra_vllm_flags: list[str] | None = None
    device: str | None = None
    activations: str | None = None
    command: str | None = None
    server_log: str | None = None


class TargetInfo(ServerInfo):
    """A configuration under test: its label, URL and served model, and what is known of its server."""

    label: str
    url: str
    model: str | None


class RunTarget(TargetInfo):
    """A target of `bench run`: what it is, how thinking was settled, MTP acceptance over the run, its
    cells (by key) and its concurrency ladder."""

    thinking: str
    acceptance: Acceptance
    cells: dict[str, CellReport]
    ladder: list[LadderRung]


class CompareRung(Part):
    """A ladder step both targets ran: the ratio A/B of its aggregate rate over the rounds."""

    concurrency: int
    aggregate_tok_s: Range | None


class Comparison(Part):
    """`bench compare`'s ratios A/B (`ratio`), rounds paired in order: per cell and figure, per ladder step."""

    a: str
    b: str
    ratio: str
    cells: dict[str, Figures]
    ladder: list[CompareRung]


class GpuClocks(Part):
    """The GPU's SM clock, power and throttle reasons over a run (gpu.summarize): not sampled and why, or
    the samples' count and interval, the clock and power ranges and limits, the hottest reading, each
    throttle reason's samples and the share of samples throttled."""

    sampled: bool
    why: str | None = None
    samples: int | None = None
    gpu_name: str | None = None
    interval_ms: int | None = None
    sm_mhz: Range | None = None
    sm_max_mhz: Number | None = None
    power_w: Range | None = None
    power_limit_w: Number | None = None
    max_temp_c: Number | None = None
    throttle_reasons: dict[str, int] | None = None
    throttled_fraction: Number | None = None
    throttled: bool | None = None


class RunOptions(Part):
    """The command line's choices (runner.Options): prompts, samplings, thinking, and the overrides of the
    config (None: the config's)."""

    prompts: list[str]
    samplings: list[str]
    thinking: str
    max_tokens: int | None
    repeats: int | None
    rounds: int | None
    max_concurrency: int | None
    ignore_eos: bool
    stall_timeout: Number


class TooGoodLines(Part):
    """The lines beyond which a figure is flagged for audit (bench.yaml's too_good)."""

    wall_tok_s: Number
    decode_tok_s: Number
    prefill_tok_s: Number
    aggregate_tok_s: Number
    ratio: Number


class RunConfig(Part):
    """The bench config the run used (workload.BenchConfig), its prompts by name only."""

    schema_version: int
    max_tokens: int
    warmup_requests: int
    repeats: int
    rounds: int
    ladder_prompt: str
    sampling: dict[str, dict[str, Number | bool | str | None]]
    too_good: TooGoodLines
    ttft_floor_s: Number
    wall_decode_margin: Number
    prompt_names: list[str]
