"""The bodies of `qwenquant bench depth`, `soak` and `turns`: one server (a URL, or --serve ARTIFACT with
its profile), the measurement, then the report delivered (output.py: JSON + PNG, tables, flag and
verdict lines) before a failing verdict exits 8, raised while a served server is still up (its death
is the run's finding, not another error)."""

from __future__ import annotations

import datetime
import logging
import platform
from collections.abc import Callable
from typing import Any, TypeVar

from qwenquant.bench import gpu as gpumod
from qwenquant.bench.checks import merge_checks
from qwenquant.bench.judge import short_stream, too_good_flags
from qwenquant.bench.longtext import LongText
from qwenquant.bench.modes import BenchReport, DepthReport, LongHead, LongReport, SoakReport, TurnsReport
from qwenquant.bench.output import deliver
from qwenquant.bench.parts import Flag, RequestRecord
from qwenquant.bench.runner import Target, note_vllm_version, resolve_model, target_info
from qwenquant.bench.session import Request, configurations, targets_of
from qwenquant.bench.workload import BenchConfig, load_config
from qwenquant.reportsink import json_on_failure

log = logging.getLogger(__name__)
R = TypeVar("R", bound=LongReport)


def _head(tool: str, argv: list[str]) -> tuple[str, list[str], str, str, str | None]:
    """Who runs the long run and when: the tool, argv, the time it started, Python, the GPU's name."""
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    return tool, argv, started, platform.python_version(), gpumod.gpu_name()


def depth_flags(report: DepthReport, cfg: BenchConfig) -> list[Flag]:
    """Rung figures beyond the bench config's too-good lines (flagged for audit, as the bench's own), every
    request's cross-checks, a stream that ended short, and a server count of a prompt that disagrees with
    /tokenize's."""
    from qwenquant.bench.depth import count_disagreement

    flags: list[Flag] = []
    for r in report.rungs:
        where = f"depth {r.depth}"
        flags += too_good_flags(
            where, {k: getattr(r, k) for k in ("wall_tok_s", "decode_tok_s", "prefill_tok_s", "ttft_s")}, cfg
        )
        requests: list[RequestRecord] = [*r.requests] if r.requests else [r]
        checks = [f for q in requests for f in q.checks]
        if r.requests:  # a burst's own checks (its queue), beside its requests'
            checks += r.checks
        flags.extend(merge_checks(checks))
        flags += _short(where, requests, report.output_tokens)
        disagree = count_disagreement(r)
        if disagree:
            flags.append(disagree)
    return flags


def _short(where: str, records: list[RequestRecord], asked: int | None) -> list[Flag]:
    """One short-stream flag for the records (requests of a rung, a turn, a stream) that ended short."""
    if not isinstance(asked, int):
        return []
    short = [q for q in records if isinstance(q.completion_tokens, int) and q.completion_tokens < asked]
    f = short_stream(where, short[0].completion_tokens, asked, short[0].finish_reason, len(short)) if short else None
    return [f] if f else []


def soak_flags(report: SoakReport, cfg: BenchConfig) -> list[Flag]:
    """Each stream's figures against the too-good lines, its cross-checks, the usage checks of the verdict
    and the queue of streams meant to run at once (its truncation is the verdict's own failure)."""
    flags = list(report.verdict.flags)
    for i, s in enumerate(report.streams):
        flags += too_good_flags(
            f"stream {i}", {k: getattr(s, k) for k in ("wall_tok_s", "decode_tok_s", "prefill_tok_s", "ttft_s")}, cfg
        )
        flags += s.checks
    return flags + report.checks


def turns_flags(report: TurnsReport, cfg: BenchConfig) -> list[Flag]:
    """Each turn's figures against the too-good lines (its prefill over the tokens it added, what a prefix
    cache leaves to compute), its cross-checks and a turn that ended short."""
    flags: list[Flag] = []
    for r in report.turns:
        where = f"turn {r.turn}"
        flags += too_good_flags(
            where,
            {k: getattr(r, k) for k in ("wall_tok_s", "decode_tok_s", "new_prefill_tok_s", "ttft_s")},
            cfg,
            {"new_prefill_tok_s": "prefill_tok_s"},
        )
        flags += merge_checks(r.checks)
        flags += _short(where, [r], report.output_tokens)
    return flags


def _long_session(
    req: Request,
    kind: type[R],
    argv: list[str],
    measure: Callable[[Target, LongText, LongHead], R],
    flags: Callable[[R], list[Flag]],
    concurrency: int = 1,
) -> R:
    """_measure_long; with --json, one JSON document on stdout whatever fails."""
    with json_on_failure(req.as_json, {"mode": kind.mode}):
        return _measure_long(req, kind, argv, measure, flags, concurrency)


def _measure_long(
    req: Request,
    kind: type[R],
    argv: list[str],
    measure: Callable[[Target, LongText, LongHead], R],
    flags: Callable[[R], list[Flag]],
    concurrency: int = 1,
) -> R:
    """One long run against one server: the shipped text, the target, `measure(target, text)`; the
    report delivered, and its failing verdict raised while a served server is still up."""
    from qwenquant.bench.longtext import load_text

    text = load_text()
    tool, argv, started, python, gpu_name = _head(f"qwenquant bench {kind.mode}", argv)
    configs = configurations(req)
    if req.serve is not None and concurrency > 1:  # refused before vLLM starts (minutes on a large model)
        from qwenquant.bench.burst import check_concurrency
        from qwenquant.bench.launch import planned_max_num_seqs

        check_concurrency(concurrency, planned_max_num_seqs(req.serve, configs[0]))
    with targets_of(req, configs) as targets:
        t = targets[0]
        t.model = resolve_model(t)
        note_vllm_version(t)
        head = LongHead(tool=tool, argv=argv, started=started, python=python, gpu_name=gpu_name, target=target_info(t))
        report = measure(t, text, head)
        report.flags = flags(report)
        err = deliver(report, req.out, as_json=req.as_json)
        if err:
            raise err
    return report


def run_depth_mode(req: Request, opts: Any, argv: list[str]) -> BenchReport:
    """The depth (or burst) ladder."""
    from qwenquant.bench.depth import run_depth

    cfg = load_config(req.config)
    return _long_session(
        req,
        DepthReport,
        argv,
        lambda t, text, head: run_depth(t, text, opts, head),
        lambda data: depth_flags(data, cfg),
        opts.concurrency,
    )


def run_soak_mode(req: Request, opts: Any, argv: list[str]) -> BenchReport:
    """The soak: windows, streams and the verdict naming the window of a failure."""
    from qwenquant.bench.soakrun import run_soak

    cfg = load_config(None)
    return _long_session(
        req,
        SoakReport,
        argv,
        lambda t, text, head: run_soak(t, text, opts, head),
        lambda d: soak_flags(d, cfg),
        opts.concurrency,
    )


def run_turns_mode(req: Request, opts: Any, argv: list[str]) -> BenchReport:
    """The conversation."""
    from qwenquant.bench.turns import run_turns

    cfg = load_config(None)
    return _long_session(
        req, TurnsReport, argv, lambda t, text, head: run_turns(t, text, opts, head), lambda d: turns_flags(d, cfg)
    )
