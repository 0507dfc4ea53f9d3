"""What the depth ladder, the burst, the conversation and the soak share: the server's max_model_len,
a prompt fitted to a depth the server counts, one greedy streamed request and its record (figures,
the stream's own count, the cross-checks), and a rung's outcome.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from qwenquant.bench import metrics
from qwenquant.bench.checks import request_checks
from qwenquant.bench.longtext import INSTRUCTION, LongText, rescale
from qwenquant.bench.parts import Acceptance, DepthRung, RequestRecord
from qwenquant.bench.rates import sample_figures
from qwenquant.bench.runner import Target
from qwenquant.bench.stream import Sample, stream_chat
from qwenquant.bench.watch import ServerWatch
from qwenquant.errors import BenchError
from qwenquant.net.http import HttpError, fetch
from qwenquant.net.prometheus import spec_counters

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


@dataclass
class RungResult:
    depth: int
    record: DepthRung
    failure: str | None = None


def served_model_field(t: Target, name: str) -> int | None:
    """An integer field /v1/models lists for the served model (vLLM lists max_model_len), else None."""
    try:
        r = fetch(t.url.rstrip("/") + "/v1/models", api_key=t.api_key, timeout=30.0)
        for m in json.loads(r.text).get("data", []):
            if m.get("id") == t.model and isinstance(m.get(name), int):
                return int(m[name])
    except (HttpError, ValueError, AttributeError):
        return None
    return None


def served_max_len(t: Target) -> int | None:
    """The max_model_len /v1/models lists for the served model (vLLM does), else None."""
    return served_model_field(t, "max_model_len")


def max_num_seqs(t: Target) -> int | None:
    """What the server runs at once: its profile's max_num_seqs (--serve), else what /v1/models lists."""
    return t.max_num_seqs if t.max_num_seqs is not None else served_model_field(t, "max_num_seqs")


class PromptFitter:
    """Builds a rung's messages at a depth the server counts: through /tokenize where the server
    has it, else by the characters per token the previous rungs' usage showed."""

    def __init__(self, t: Target, text: LongText, thinking: bool | None) -> None:
        self.t, self.text, self.thinking = t, text, thinking
        self.tokenize: bool | None = None  # unknown until asked
        self.chars_per_token = FIRST_CHARS_PER_TOKEN
        self.calibrated = False  # chars_per_token came from a server's count
        self.exact_depth: int | None = None  # the ladder's top rung: fitted to exactly this count where it can be

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
        (proportional guesses, then bisection on the length between the best below and the least above); the
        top rung (`exact_depth`) exactly at its count where some length of the text gives it."""
        exact = depth == self.exact_depth
        tolerance = 0.0 if exact else FIT_TOLERANCE
        n_chars = int(depth * self.chars_per_token)
        lo: tuple[int, int, list[dict[str, str]]] | None = None  # (chars, tokens, messages) at or below depth
        hi: int | None = None  # the fewest characters seen above depth
        for _ in range(FIT_ROUNDS * (2 if exact else 1)):
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
            if got >= depth * (1 - tolerance) and got <= depth:
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


def chat_request(t: Target, msgs: list[dict[str, str]], output_tokens: int, thinking: bool | None) -> dict[str, Any]:
    """One greedy streamed chat request of `output_tokens` tokens (a depth rung, a burst's prompt, a turn,
    a soak's stream), token ids asked for so the stream's own count is exact where vLLM sends them."""
    body: dict[str, Any] = {
        "model": t.model,
        "messages": msgs,
        "max_tokens": output_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    if thinking is not None:
        body["chat_template_kwargs"] = {"enable_thinking": thinking}
    return body


def stream_once(
    t: Target, body: dict[str, Any], stall_timeout: float, on_chunk: Any = None
) -> tuple[Sample | None, str | None]:
    """One streamed chat request: (the sample, None) or (None, why it failed: a stall past
    `stall_timeout`, a stream cut before `[DONE]`, or the server's error)."""
    try:
        return stream_chat(t.url, body, api_key=t.api_key, stall_timeout=stall_timeout, on_chunk=on_chunk), None
    except BenchError as e:
        return None, e.message


def request_record(s: Sample, where: str) -> RequestRecord:
    """One request's figures, its counts (usage and the stream's own) and its cross-check flags."""
    return RequestRecord(
        **sample_figures(s),
        prompt_tokens=s.prompt_tokens,
        completion_tokens=s.completion_tokens,
        finish_reason=s.finish_reason,
        text_events=s.text_events,
        streamed_tokens=s.streamed_tokens,
        streamed_exact=s.exact,
        reasoning_tokens=s.reasoning_tokens,
        checks=request_checks(s, where),
    )


def empty_failure(s: Sample) -> str | None:
    """'empty output ...' when the request produced nothing: no token by usage or by the stream."""
    if s.completion_tokens == 0 or not (sum(s.chars.values()) or s.token_ids):
        return f"empty output ({s.completion_tokens} completion tokens, {sum(s.chars.values())} characters)"
    return None


def acceptance_between(before: str | None, after: str | None) -> Acceptance:
    """MTP acceptance over two /metrics pages (none when either is missing)."""
    if before is not None and after is not None:
        return metrics.acceptance(spec_counters(after).minus(spec_counters(before)))
    return Acceptance(metrics_page=False, speculative=None)


def with_server_state(watch: ServerWatch, failure: str | None, after: str | None) -> str | None:
    """A request's failure joined with what the server's state says (a restart, an exit, a fatal log line)."""
    why = watch.supervised() or watch.seen_page(after)
    if failure and why is None:
        why = watch.problem()
    return f"{failure}; {why}" if failure and why else (why or failure)
