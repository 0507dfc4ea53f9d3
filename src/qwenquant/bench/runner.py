"""Run the workload against one or more servers: warm-up, then rounds (A B A B ...) of every cell.

Warm-up requests (and the thinking probe) run before any counter is read and are never reported.
/metrics is scraped around each configuration's share of each round, so acceptance counts only
measured requests, and with two servers each one's counters stay its own.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from qwenquant.bench import metrics
from qwenquant.bench.parts import Flag, RunFailure
from qwenquant.bench.runparts import ServerInfo, TargetInfo
from qwenquant.bench.stream import Sample, stream_chat
from qwenquant.bench.workload import BenchConfig, Cell, plan_cells, request_body, thinking_modes
from qwenquant.errors import BenchError
from qwenquant.net.http import HttpError, get_json, server_hint
from qwenquant.net.prometheus import SpecCounters, spec_counters

log = logging.getLogger(__name__)
PROBE_TOKENS = 16


@dataclass
class Target:
    """One configuration under test: a server URL and what is known about it."""

    label: str
    url: str
    model: str | None = None  # None: the first model /v1/models lists
    api_key: str | None = None
    max_num_seqs: int | None = None
    template_thinking: bool | None = None  # None: unknown, ask the server
    info: ServerInfo = field(default_factory=ServerInfo)
    server: Any = None  # with --serve: the supervised process (qwenquant.serve.supervisor.Server)


def target_info(t: Target) -> TargetInfo:
    """What a report says of a target: its label, URL, model, and what is known of its server."""
    return TargetInfo(label=t.label, url=t.url, model=t.model, **t.info.given())


@dataclass(frozen=True)
class Options:
    prompts: list[str]
    samplings: list[str]
    thinking: str = "auto"
    max_tokens: int | None = None
    repeats: int | None = None
    rounds: int | None = None
    max_concurrency: int | None = None
    ignore_eos: bool = True
    stall_timeout: float = 300.0  # seconds without a token that fail a request


@dataclass
class TargetRun:
    """What one configuration measured: samples per cell and round, ladder waves, spec counters."""

    target: Target
    cells: list[Cell]
    ladder: list[Cell]
    thinking_note: str
    samples: dict[str, list[list[Sample]]] = field(default_factory=dict)  # cell key -> rounds -> samples
    waves: dict[str, list[list[list[Sample]]]] = field(default_factory=dict)  # cell key -> rounds -> waves
    spec: SpecCounters = field(default_factory=SpecCounters)
    metrics_exported: bool = True
    failure: RunFailure | None = None  # the first request that failed: the run stops there
    queued: dict[str, list[Flag]] = field(default_factory=dict)  # cell key -> its waves' "queued" flags


def _get_json(url: str, api_key: str | None) -> Any:
    try:
        return get_json(url, api_key=api_key)
    except HttpError as e:
        raise BenchError(e.message, hint=server_hint(e, api_key)) from None


def resolve_model(t: Target) -> str:
    """The served model name: given, or the first one /v1/models lists."""
    if t.model:
        return t.model
    data = _get_json(t.url.rstrip("/") + "/v1/models", t.api_key)
    try:
        return str(data["data"][0]["id"])
    except (KeyError, IndexError, TypeError):
        raise BenchError(f"{t.url}/v1/models lists no model", hint="pass --model NAME") from None


def server_version(t: Target) -> str | None:
    """vLLM's /version, or None when the server has none."""
    try:
        return str(_get_json(t.url.rstrip("/") + "/version", t.api_key).get("version"))
    except (BenchError, AttributeError):
        return None


def note_vllm_version(t: Target) -> None:
    """The target's vLLM version as its server says it (else the one installed where --serve started it)."""
    version = server_version(t) or t.info.vllm_version_installed
    t.info = t.info.model_copy(update={"vllm_version": version})


def run_wave(t: Target, body: dict[str, Any], n: int, stall_timeout: float) -> list[Sample]:
    """`n` identical requests released together; the first failure raised (the warm-up's: nothing measured)."""
    samples, failures = measure_wave(t, body, n, stall_timeout)
    if failures:
        raise failures[0]
    return samples


def measure_wave(
    t: Target, body: dict[str, Any], n: int, stall_timeout: float
) -> tuple[list[Sample], list[BenchError]]:
    """`n` identical requests released together (each on its own connection): the samples of those that
    worked and the failure of each that did not (a failed request never discards the others)."""
    gate = threading.Barrier(n)

    def one(_: int) -> Sample | BenchError:
        if n > 1:
            gate.wait()
        try:
            return stream_chat(t.url, body, api_key=t.api_key, stall_timeout=stall_timeout)
        except BenchError as e:
            return e

    with ThreadPoolExecutor(n) as pool:
        got = list(pool.map(one, range(n)))
    return [g for g in got if isinstance(g, Sample)], [g for g in got if isinstance(g, BenchError)]


def detect_thinking(t: Target, cfg: BenchConfig, prompt: str, stall_timeout: float) -> tuple[bool | None, str]:
    """Does enable_thinking switch reasoning on and off? From the template when known, else by asking."""
    if t.template_thinking is not None:
        word = "reads" if t.template_thinking else "does not read"
        return t.template_thinking, f"the artifact's chat template {word} enable_thinking"
    seen = {}
    for mode in (True, False):
        body = request_body(cfg, t.model or "", Cell(prompt, "greedy", mode), max_tokens=PROBE_TOKENS, ignore_eos=False)
        seen[mode] = stream_chat(t.url, body, api_key=t.api_key, stall_timeout=stall_timeout).reasoning_streamed
    ok = seen[True] and not seen[False]
    return ok, (
        f"probe: enable_thinking=true streamed {'reasoning' if seen[True] else 'no reasoning'}, "
        f"false streamed {'reasoning' if seen[False] else 'no reasoning'}"
    )


def prepare_target(t: Target, cfg: BenchConfig, opts: Options) -> TargetRun:
    """Resolve the model, decide thinking modes, plan the cells, run the warm-up."""
    t.model = resolve_model(t)
    supported: bool | None = None
    note = f"--thinking {opts.thinking}"
    if opts.thinking == "auto":
        supported, note = detect_thinking(t, cfg, cfg.ladder_prompt, opts.stall_timeout)
    modes = thinking_modes(opts.thinking, supported)
    top = opts.max_concurrency or t.max_num_seqs or 1
    cells, steps = plan_cells(cfg, opts.prompts, opts.samplings, modes, top)
    tokens = opts.max_tokens or cfg.max_tokens
    singles = [c for c in cells if c.concurrency == 1]
    for i in range(cfg.warmup_requests):
        run_wave(
            t,
            request_body(cfg, t.model, singles[i % len(singles)], max_tokens=tokens, ignore_eos=opts.ignore_eos),
            1,
            opts.stall_timeout,
        )
    if cfg.warmup_requests and steps[-1].concurrency > 1:
        top_cell = steps[-1]
        run_wave(
            t,
            request_body(cfg, t.model, top_cell, max_tokens=tokens, ignore_eos=opts.ignore_eos),
            top_cell.concurrency,
            opts.stall_timeout,
        )
    log.info("%s: %s, model %s, %d cells, warm-up done", t.label, t.url, t.model, len(cells))
    return TargetRun(t, cells, steps, note)


def run_round(run: TargetRun, cfg: BenchConfig, opts: Options, index: int = 0) -> None:
    """Every cell of one configuration once (`repeats` waves each), counters read around it; a request that
    fails ends the round there, its failure recorded and what was measured before it kept."""
    t = run.target
    before = metrics.scrape(t.url, t.api_key)
    tokens = opts.max_tokens or cfg.max_tokens
    repeats = opts.repeats or cfg.repeats
    for cell in run.cells:
        body = request_body(cfg, t.model or "", cell, max_tokens=tokens, ignore_eos=opts.ignore_eos)
        waves: list[list[Sample]] = []
        partial: list[Sample] = []  # a failed wave's requests that worked: their own figures, no aggregate
        for _ in range(repeats):
            samples, failures = _watched_wave(run, cell, body, opts.stall_timeout)
            if failures:
                partial = samples
                run.failure = RunFailure(
                    target=t.label,
                    cell=cell.key,
                    round=index + 1,
                    failed=len(failures),
                    of=cell.concurrency,
                    reason=failures[0].message,
                )
                break
            waves.append(samples)
        run.waves.setdefault(cell.key, []).append(waves)
        run.samples.setdefault(cell.key, []).append([s for w in waves for s in w] + partial)
        if run.failure:
            break
        log.info("%s: %s done", t.label, cell.key)
    after = metrics.scrape(t.url, t.api_key)
    if before is None or after is None:
        run.metrics_exported = False
        return
    run.spec = run.spec.plus(spec_counters(after).minus(spec_counters(before)))


def _watched_wave(
    run: TargetRun, cell: Cell, body: dict[str, Any], stall_timeout: float
) -> tuple[list[Sample], list[BenchError]]:
    """One wave; a wave of several streams with the server's queue watched, as a burst's rung is (burst.py):
    streams that waited while the server never ran them all at once are a "queued" flag of the ladder step."""
    t, n = run.target, cell.concurrency
    if n == 1:
        return measure_wave(t, body, n, stall_timeout)
    from qwenquant.bench.queued import QueueWatch, decoding_at_once, queued_checks

    with QueueWatch(t) as queue:
        samples, failures = measure_wave(t, body, n, stall_timeout)
    run.queued.setdefault(cell.key, []).extend(
        queued_checks(
            queue.result,
            n,
            f"{t.label} ladder c{n}",
            decoding_at_once(samples),
            "the ladder step measured a queue, not {n} streams at once",
        )
    )
    return samples, failures


def run_bench(targets: list[Target], cfg: BenchConfig, opts: Options) -> list[TargetRun]:
    """Warm every target up, then `rounds` rounds in which each target runs every cell in turn."""
    runs = [prepare_target(t, cfg, opts) for t in targets]
    rounds = opts.rounds or (cfg.rounds if len(targets) > 1 else 1)
    for r in range(rounds):
        for run in runs:
            log.info("round %d/%d: %s", r + 1, rounds, run.target.label)
            run_round(run, cfg, opts, r)
            if run.failure:
                return runs
    return runs
