"""`qwenquant bench --depth`: speed and health against prompt depth, one fresh prompt per rung.

For each depth of the ladder one streamed request is sent whose prompt the server counts at that
depth (the length is fitted through the server's /tokenize where it has one, else from the
characters per token of the rungs before, kept just under the target), with a fixed output
(ignore_eos). Per rung: TTFT and prefill rate, wall and decode rates (rates.py), MTP acceptance per
draft position (/metrics deltas around the rung), the GPU memory peak (nvidia-smi). The first rung
that fails (an HTTP error, a stall past --stall-timeout, empty output, the server dying or logging
an out-of-memory line) ends the ladder; the report names it and the last depth that worked.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import secrets
import time
from dataclasses import dataclass
from typing import Any

from qwenquant.bench import metrics
from qwenquant.bench.gpu import MemoryPeak
from qwenquant.bench.longtext import INSTRUCTION, LongText, depth_ladder, rescale, rung_header
from qwenquant.bench.rates import sample_figures
from qwenquant.bench.runner import Target
from qwenquant.bench.stream import Sample, stream_chat
from qwenquant.bench.watch import ServerWatch
from qwenquant.errors import BenchError, UsageError
from qwenquant.net.http import HttpError, fetch
from qwenquant.net.prometheus import spec_counters

log = logging.getLogger(__name__)
FIT_ROUNDS = 16
FIT_TOLERANCE = 0.001  # a fitted prompt lands within 0.1% below its depth (never above)
FIRST_CHARS_PER_TOKEN = 2.0  # without /tokenize: few characters per token, so the first guess falls short
NO_TOKENIZE_MARGIN = 0.98


@dataclass(frozen=True)
class DepthOptions:
    depths: list[int] | None = None  # None: the doubling ladder up to max_model_len - output
    output_tokens: int = 64
    reuse_prefix: bool = False
    stall_timeout: float = 300.0
    thinking: bool | None = False
    concurrency: int = 1  # above 1: each rung a burst of that many fresh prompts at once (burst.py)


def served_max_len(t: Target) -> int | None:
    """The max_model_len /v1/models lists for the served model (vLLM does), else None."""
    try:
        r = fetch(t.url.rstrip("/") + "/v1/models", api_key=t.api_key, timeout=30.0)
        for m in json.loads(r.text).get("data", []):
            if m.get("id") == t.model and isinstance(m.get("max_model_len"), int):
                return int(m["max_model_len"])
    except (HttpError, ValueError, AttributeError):
        return None
    return None


def plan_depths(opts: DepthOptions, max_len: int | None) -> list[int]:
    """The rungs: --depths as given (each must leave room for the output), else the doubling ladder."""
    if max_len is None and not opts.depths:
        raise UsageError("the server does not say its max_model_len, so the depth ladder has no top",
                         hint="pass --depths 1024,4096,...")
    if opts.depths:
        for d in opts.depths:
            if max_len is not None and d + opts.output_tokens > max_len:
                raise UsageError(f"--depths {d} plus {opts.output_tokens} output tokens exceeds the server's "
                                 f"max_model_len {max_len}", hint=f"the deepest prompt is {max_len - opts.output_tokens}")
        return list(opts.depths)
    assert max_len is not None
    return depth_ladder(max_len - opts.output_tokens)


class PromptFitter:
    """Builds a rung's messages at a depth the server counts: through /tokenize where the server
    has it, else by the characters per token the previous rungs' usage showed."""

    def __init__(self, t: Target, text: LongText, thinking: bool | None) -> None:
        self.t, self.text, self.thinking = t, text, thinking
        self.tokenize: bool | None = None  # unknown until asked
        self.chars_per_token = FIRST_CHARS_PER_TOKEN
        self.calibrated = False  # chars_per_token came from a server's count

    def messages(self, header: str, n_chars: int, start: int) -> list[dict[str, str]]:
        return [{"role": "user", "content": header + self.text.take(n_chars, start) + INSTRUCTION}]

    def count(self, msgs: list[dict[str, str]]) -> int | None:
        if self.tokenize is False:
            return None
        body: dict[str, Any] = {"model": self.t.model, "messages": msgs, "add_generation_prompt": True}
        if self.thinking is not None:
            body["chat_template_kwargs"] = {"enable_thinking": self.thinking}
        try:
            r = fetch(self.t.url.rstrip("/") + "/tokenize", body, api_key=self.t.api_key, timeout=120.0)
            n = int(json.loads(r.text)["count"]) if r.status == 200 else None
        except (HttpError, ValueError, KeyError, TypeError):
            n = None
        self.tokenize = n is not None
        return n

    def fit(self, depth: int, header: str, start: int) -> tuple[list[dict[str, str]], int | None]:
        """(messages, the /tokenize count or None): at most `depth` tokens, as close below as fits
        (proportional guesses, then bisection on the length between the best below and the least above)."""
        n_chars = int(depth * self.chars_per_token)
        lo: tuple[int, int, list[dict[str, str]]] | None = None  # (chars, tokens, messages) at or below depth
        hi: int | None = None  # the fewest characters seen above depth
        for _ in range(FIT_ROUNDS):
            msgs = self.messages(header, n_chars, start)
            got = self.count(msgs)
            if got is None:
                margin = NO_TOKENIZE_MARGIN if self.calibrated else 1.0
                return self.messages(header, int(depth * self.chars_per_token * margin), start), None
            self.chars_per_token, self.calibrated = n_chars / max(1, got), True
            if got <= depth and (lo is None or got > lo[1]):
                lo = (n_chars, got, msgs)
            if got > depth:
                hi = n_chars if hi is None else min(hi, n_chars)
            if got >= depth * (1 - FIT_TOLERANCE) and got <= depth:
                break
            if lo is not None and hi is not None:
                if hi - lo[0] <= 1:
                    break
                n_chars = (lo[0] + hi) // 2
            else:
                n_chars = rescale(n_chars, got, depth)
        if lo is None:
            raise BenchError(f"no prompt of at most {depth} tokens could be fitted", hint="try another --depths")
        return lo[2], lo[1]


@dataclass
class RungResult:
    depth: int
    record: dict[str, Any]
    failure: str | None = None


class FirstToken:
    """The clock of the first chunk that carries token ids (vLLM's return_token_ids): a model whose
    first tokens decode to no text (random weights) still has a TTFT and a decode phase."""

    def __init__(self) -> None:
        self.t: float | None = None
        self.ids = 0

    def __call__(self, chunk: dict[str, Any]) -> None:
        n = sum(len(c.get("token_ids") or []) for c in chunk.get("choices") or [] if isinstance(c, dict))
        if n and self.t is None:
            self.t = time.perf_counter()
        self.ids += n

    def apply(self, s: Sample) -> Sample:
        if self.t is not None and (s.t_first is None or self.t < s.t_first):
            return dataclasses.replace(s, t_first=self.t)
        return s


def stream_once(t: Target, msgs: list[dict[str, str]], opts: Any, first: FirstToken,
                on_chunk: Any) -> tuple[Sample | None, str | None]:
    """One streamed chat request: (the sample, None) or (None, why it failed: a stall past
    `opts.stall_timeout` or the server's error)."""
    try:
        return first.apply(stream_chat(t.url, chat_request(t, msgs, opts), api_key=t.api_key,
                                       timeout=opts.stall_timeout, on_chunk=on_chunk)), None
    except BenchError as e:
        return None, (f"stalled: no byte from the server for {opts.stall_timeout:g} s" if "timed out" in e.message
                      else e.message)


def chat_request(t: Target, msgs: list[dict[str, str]], opts: Any) -> dict[str, Any]:
    """One greedy streamed chat request of `opts.output_tokens` tokens (a depth rung, a burst's prompt, a turn)."""
    body: dict[str, Any] = {"model": t.model, "messages": msgs, "max_tokens": opts.output_tokens,
                            "temperature": 0.0, "ignore_eos": True, "return_token_ids": True}
    if opts.thinking is not None:
        body["chat_template_kwargs"] = {"enable_thinking": opts.thinking}
    return body


def _figures(s: Sample) -> dict[str, Any]:
    f = sample_figures(s)
    return {**f, "prompt_tokens": s.prompt_tokens, "completion_tokens": s.completion_tokens,
            "finish_reason": s.finish_reason, "text_events": s.text_events}


def _empty(s: Sample, ids: int) -> str | None:
    if s.completion_tokens == 0 or not (sum(s.chars.values()) or ids):
        return f"empty output ({s.completion_tokens} completion tokens, {sum(s.chars.values())} characters)"
    return None


def run_rung(t: Target, watch: ServerWatch, fitter: PromptFitter, depth: int, index: int, nonce: str,
             opts: DepthOptions) -> RungResult:
    """One rung: fit, send, measure; a failure is recorded, never raised."""
    header = rung_header(index, depth, nonce, opts.reuse_prefix)
    msgs, counted = fitter.fit(depth, header, start=0 if opts.reuse_prefix else index * 7919)
    chars = len(msgs[0]["content"])
    rec: dict[str, Any] = {"depth": depth, "prompt_chars": chars, "tokenize_count": counted}
    before = metrics.scrape(t.url, t.api_key)
    first = FirstToken()
    with MemoryPeak() as mem:
        t0 = time.monotonic()
        sample, failure = stream_once(t, msgs, opts, first, first)
        rec["seconds"] = time.monotonic() - t0
    rec["gpu_memory"] = mem.result
    after = metrics.scrape(t.url, t.api_key)
    if sample is not None:
        rec.update(_figures(sample))
        if sample.prompt_tokens:
            fitter.chars_per_token, fitter.calibrated = chars / sample.prompt_tokens, True
        rec["streamed_chars"] = sum(sample.chars.values())
        failure = failure or _empty(sample, first.ids)
    if before is not None and after is not None:
        rec["acceptance"] = metrics.acceptance(spec_counters(after).minus(spec_counters(before)))
    else:
        rec["acceptance"] = {"metrics_page": False, "speculative": None}
    why = watch.supervised() or watch.seen_page(after)
    if failure and why is None:
        why = watch.problem()
    return RungResult(depth, rec, f"{failure}; {why}" if failure and why else (why or failure))


def run_depth(t: Target, text: LongText, opts: DepthOptions) -> dict[str, Any]:
    """The ladder on one server; the part of the report that is measured (JSON-ready)."""
    from qwenquant.bench.burst import check_concurrency, run_burst_rung

    check_concurrency(opts.concurrency, t.max_num_seqs)
    max_len = served_max_len(t)
    depths = plan_depths(opts, max_len)
    rung = run_burst_rung if opts.concurrency > 1 else run_rung
    watch = ServerWatch(t.url, t.api_key, t.server, metrics.scrape(t.url, t.api_key))
    fitter = PromptFitter(t, text, opts.thinking)
    nonce = secrets.token_hex(4)
    rungs: list[dict[str, Any]] = []
    failure: dict[str, Any] | None = None
    for i, depth in enumerate(depths):
        log.info("depth %d (%d/%d)", depth, i + 1, len(depths))
        r = rung(t, watch, fitter, depth, i, nonce, opts)
        r.record["ok"] = r.failure is None
        rungs.append(r.record)
        if r.failure:
            failure = {"depth": depth, "reason": r.failure}
            break
    ok = [r["prompt_tokens"] for r in rungs if r["ok"]]
    return {"max_model_len": max_len, "output_tokens": opts.output_tokens, "depths": depths,
            "concurrency": opts.concurrency,
            "reuse_prefix": opts.reuse_prefix, "tokenize": fitter.tokenize, "nonce": nonce,
            "text": {"sha256": text.sha256, "license": text.license, "source": text.source},
            "rungs": rungs, "last_ok_depth": ok[-1] if ok else None, "failure": failure, "server": watch.info()}
