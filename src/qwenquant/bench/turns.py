"""`qwenquant bench turns`: one conversation that accumulates context, turn by turn.

Turn 0 sends a user message of --turn-tokens tokens of the shipped text (its first line unique to
the run); each later turn sends the whole conversation so far (every user message and assistant
answer) plus a new user message of --turn-tokens tokens, through /v1/chat/completions, until the
next turn would pass max_model_len minus the output. Only the new tokens need a prefill when the
server caches prefixes, so per turn: the context depth (the server's prompt_tokens), TTFT, the
prefill rate of the new tokens (prompt tokens added since the previous turn / TTFT), the deltas of
vLLM's prefix-cache counters (`vllm:prefix_cache_queries` / `_hits`, where /metrics has them),
decode rate, MTP acceptance, GPU peak. Whether the server cached is read from the hits, never
assumed. A failing turn ends the conversation (the failure kinds of depth.py).
"""

from __future__ import annotations

import logging
import secrets
import time
from dataclasses import dataclass
from typing import Any

from qwenquant.bench import metrics, rung
from qwenquant.bench.gpu import MemoryPeak
from qwenquant.bench.longtext import LongText
from qwenquant.bench.modes import LongHead, TurnsReport
from qwenquant.bench.parts import Acceptance, CacheDelta, Failure, GpuMemory, PrefixCache, RequestRecord, TurnRecord
from qwenquant.bench.runner import Target
from qwenquant.bench.stream import Sample
from qwenquant.bench.watch import ServerWatch
from qwenquant.errors import UsageError
from qwenquant.net.prometheus import prefix_cache_counters

log = logging.getLogger(__name__)
NO_TOKENIZE_MARGIN = 1.05  # without /tokenize the next turn's depth is estimated, with this much to spare


@dataclass(frozen=True)
class TurnOptions:
    turn_tokens: int = 2048
    output_tokens: int = 64
    stall_timeout: float = 300.0
    thinking: bool | None = False


def new_tokens(prompt_tokens: int | None, previous: int | None) -> int | None:
    """The prompt tokens a turn added to the previous turn's prompt (its answer and the new message)."""
    if prompt_tokens is None:
        return None
    return prompt_tokens - (previous or 0)


def cache_delta(before: str | None, after: str | None) -> CacheDelta | None:
    """The prefix-cache counters' change over a turn; None when /metrics lacks them."""
    b = prefix_cache_counters(before) if before is not None else None
    a = prefix_cache_counters(after) if after is not None else None
    if a is None or b is None:
        return None
    return CacheDelta(queries=a["queries"] - b["queries"], hits=a["hits"] - b["hits"])


def cache_verdict(turns: list[TurnRecord]) -> PrefixCache:
    """Whether the server cached: hits > 0 over the turns after the first (None: no counters)."""
    deltas = [t.prefix_cache for t in turns[1:] if t.prefix_cache is not None]
    if not deltas:
        counters = any(t.prefix_cache is not None for t in turns)
        return PrefixCache(counters=counters, cached=None, hits=None, queries=None)
    hits, queries = sum(d.hits for d in deltas), sum(d.queries for d in deltas)
    return PrefixCache(counters=True, cached=hits > 0, hits=hits, queries=queries)


def fits(next_depth: int, output: int, max_len: int) -> bool:
    """The next turn's prompt plus its output within max_model_len."""
    return next_depth + output <= max_len


class Conversation:
    """The messages so far, and the user message of each next turn."""

    def __init__(self, t: Target, text: LongText, opts: TurnOptions, nonce: str) -> None:
        self.fitter = rung.PromptFitter(t, text, opts.thinking)
        self.opts, self.nonce = opts, nonce
        self.messages: list[dict[str, str]] = []

    def next_messages(self, turn: int) -> list[dict[str, str]]:
        """The conversation so far plus a new user message fitted (alone, through /tokenize where the
        server has it) to --turn-tokens: another part of the text has another density."""
        header = f"# qwenquant bench --turns: turn {turn}, run {self.nonce}\n"
        msgs, _ = self.fitter.fit(self.opts.turn_tokens, header, start=turn * 7919)
        return [*self.messages, *msgs]

    def depth(self, msgs: list[dict[str, str]], last_total: int) -> int:
        """The server's count of `msgs` (/tokenize), else an estimate from the last turn's total."""
        n = self.fitter.count(msgs)
        if n is not None:
            return n
        return last_total + int(self.opts.turn_tokens * NO_TOKENIZE_MARGIN)


@dataclass(frozen=True)
class TurnRequest:
    """What one turn's request gave: its messages, the GPU memory peak, the prefix cache's counters and MTP
    acceptance around it, and its record (None: no answer came back)."""

    messages: int
    gpu_memory: GpuMemory
    prefix_cache: CacheDelta | None
    acceptance: Acceptance
    record: RequestRecord | None


def run_turn(
    t: Target, msgs: list[dict[str, str]], opts: TurnOptions, turn: int
) -> tuple[TurnRequest, Sample | None, str, str | None]:
    """One turn: (what its request gave, sample, the answer's text, failure)."""
    answer: list[str] = []

    def on_chunk(chunk: dict[str, Any]) -> None:
        for c in chunk.get("choices") or []:
            if isinstance(c, dict):
                answer.append((c.get("delta") or {}).get("content") or "")

    before = metrics.scrape(t.url, t.api_key)
    with MemoryPeak() as mem:
        sample, failure = rung.stream_once(
            t, rung.chat_request(t, msgs, opts.output_tokens, opts.thinking), opts.stall_timeout, on_chunk
        )
    after = metrics.scrape(t.url, t.api_key)
    record = None
    if sample is not None:
        record = rung.request_record(sample, f"turn {turn}")
        failure = failure or rung.empty_failure(sample)
    got = TurnRequest(len(msgs), mem.result, cache_delta(before, after), rung.acceptance_between(before, after), record)
    return got, sample, "".join(answer), failure


def _max_len(t: Target, opts: TurnOptions) -> int:
    """The server's max_model_len, the conversation's end (exit 2: unknown, or no room for one turn)."""
    max_len = rung.served_max_len(t)
    if max_len is None:
        raise UsageError(
            "the server does not say its max_model_len, so the conversation has no end",
            hint="serve it with vLLM, whose /v1/models lists max_model_len",
        )
    if not fits(opts.turn_tokens, opts.output_tokens, max_len):
        raise UsageError(
            f"--turn-tokens {opts.turn_tokens} plus {opts.output_tokens} output tokens exceeds the "
            f"server's max_model_len {max_len}",
            hint=f"use --turn-tokens {max_len // 4} or less",
        )
    return max_len


def _turn_record(turn: int, depth: int, got: TurnRequest, seconds: float, previous: int | None, ok: bool) -> TurnRecord:
    """One turn's record: its depth (the server's count where it answered), the request's record, and the
    tokens new since the last turn with their prefill rate."""
    rec = got.record
    new = new_tokens(rec.prompt_tokens if rec else None, previous)
    ttft = rec.ttft_s if rec else None
    return TurnRecord(
        turn=turn,
        depth=rec.prompt_tokens if rec and rec.prompt_tokens is not None else depth,
        messages=got.messages,
        gpu_memory=got.gpu_memory,
        prefix_cache=got.prefix_cache,
        acceptance=got.acceptance,
        **(rec.given() if rec else {}),
        seconds=seconds,
        new_tokens=new,
        new_prefill_tok_s=new / ttft if new and ttft else None,
        ok=ok,
    )


def run_turns(t: Target, text: LongText, opts: TurnOptions, head: LongHead) -> TurnsReport:
    """The conversation on one server: its report (`head`: who ran it, against what)."""
    max_len = _max_len(t, opts)
    watch = ServerWatch(t.url, t.api_key, t.server, metrics.scrape(t.url, t.api_key))
    nonce = secrets.token_hex(4)
    conv = Conversation(t, text, opts, nonce)
    turns: list[TurnRecord] = []
    failure: Failure | None = None
    previous, total, turn = None, 0, 0
    while True:
        msgs = conv.next_messages(turn)
        depth = conv.depth(msgs, total)
        if turn > 0 and not fits(depth, opts.output_tokens, max_len):
            break
        log.info("turn %d at about %d tokens", turn, depth)
        t0 = time.monotonic()
        got, sample, answer, why = run_turn(t, msgs, opts, turn)
        seconds = time.monotonic() - t0
        seen = watch.supervised() or watch.seen_page(metrics.scrape(t.url, t.api_key))
        if why and seen is None:
            seen = watch.problem()
        why = f"{why}; {seen}" if why and seen else (seen or why)
        rec = _turn_record(turn, depth, got, seconds, previous, ok=why is None)
        turns.append(rec)
        if why or sample is None:
            failure = Failure(turn=turn, depth=rec.depth, reason=why or "no answer")
            break
        conv.messages = [*msgs, {"role": "assistant", "content": answer}]
        if sample.prompt_tokens:
            chars = sum(len(m["content"]) for m in msgs)
            conv.fitter.chars_per_token, conv.fitter.calibrated = chars / sample.prompt_tokens, True
        previous, total, turn = sample.prompt_tokens, sample.prompt_tokens + sample.completion_tokens, turn + 1
    ok = [r for r in turns if r.ok]
    return TurnsReport(
        **head,
        max_model_len=max_len,
        output_tokens=opts.output_tokens,
        turn_tokens=opts.turn_tokens,
        tokenize=conv.fitter.tokenize,
        nonce=nonce,
        text=text.source_part(),
        turns=turns,
        prefix_cache=cache_verdict(turns),
        last_ok_turn=ok[-1].turn if ok else None,
        last_ok_depth=ok[-1].depth if ok else None,
        failure=failure,
        server=watch.info(),
    )
