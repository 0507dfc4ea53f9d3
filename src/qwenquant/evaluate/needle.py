"""Served retrieval at depth: a fact (a six-digit code) planted at several depths of shipped filler
text, for prompts doubling from `min_tokens` up to the server's max_model_len (the promised context),
greedy, thinking off. Every length is counted by the server (`/tokenize`, and the answer's
`usage.prompt_tokens`); a depth passes when the answer holds the code. Standard library and the typed report
parts (reportparts).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

from qwenquant.errors import BenchError, UsageError
from qwenquant.evaluate.reportparts import Needle, NeedleDepth
from qwenquant.evaluate.served import server_hint
from qwenquant.evaluate.specs import NeedleSpec
from qwenquant.net.http import HttpError, fetch, post_json

REQUEST_TIMEOUT = 600.0  # a long prompt's prefill on a slow card
# the shortest prompt worth a case: the needle sentence, the question and some filler around them
MIN_PROMPT_TOKENS = 128


def check_needle_max_len(spec: NeedleSpec, max_len: int) -> None:
    """Refuse a --needle-max-len that leaves no case (before any server is asked): the prompt it
    allows, less the answer's tokens, must hold MIN_PROMPT_TOKENS."""
    answer = spec.answer_tokens
    if max_len - answer < MIN_PROMPT_TOKENS:
        raise UsageError(
            f"--needle-max-len {max_len} leaves no needle case: a case needs at least "
            f"{MIN_PROMPT_TOKENS + answer} tokens ({MIN_PROMPT_TOKENS} of prompt + {answer} of answer)",
            hint=f"pass --needle-max-len {spec.min_tokens + answer} or more, or leave it out "
            "(the server's max_model_len)",
        )


def _post(url: str, body: dict[str, Any], api_key: str | None, timeout: float = 120.0) -> Any:
    try:
        return post_json(url, body, api_key=api_key, timeout=timeout)
    except HttpError as e:
        hint = (
            server_hint(e, api_key)
            if e.status in (401, 403)
            else "the needle task needs the server's /tokenize (vLLM's OpenAI server has it)"
        )
        raise BenchError(e.message, hint=hint) from None


class _Counter:
    """Token counts from the server's /tokenize, memoised per text."""

    def __init__(self, url: str, model: str, api_key: str | None) -> None:
        self.url, self.model, self.api_key = url, model, api_key
        self.memo: dict[str, int] = {}
        self.max_model_len: int | None = None

    def text(self, text: str) -> int:
        if text not in self.memo:
            r = _post(
                f"{self.url}/tokenize", {"model": self.model, "prompt": text, "add_special_tokens": False}, self.api_key
            )
            self.memo[text] = int(r["count"])
            self.max_model_len = r.get("max_model_len") or self.max_model_len
        return self.memo[text]

    def chat(self, messages: list[dict[str, str]]) -> int:
        r = _post(
            f"{self.url}/tokenize",
            {
                "model": self.model,
                "messages": messages,
                "add_generation_prompt": True,
                "chat_template_kwargs": {"enable_thinking": False},
            },
            self.api_key,
        )
        return int(r["count"])


def ladder(min_tokens: int, limit: int) -> list[int]:
    """Prompt lengths: min_tokens doubling while below `limit`, then `limit` itself."""
    out, n = [], min_tokens
    while n < limit:
        out.append(n)
        n *= 2
    return [*out, limit] if limit > 0 else out


def _filler(spec: NeedleSpec, count: _Counter, tokens: int) -> list[str]:
    """Filler sentences (cycled) adding up to about `tokens` tokens."""
    out: list[str] = []
    total = i = 0
    sentences = spec.filler
    while total < tokens:
        s = sentences[i % len(sentences)]
        total += count.text(" " + s)
        out.append(s)
        i += 1
    return out


@dataclass(frozen=True)
class _Case:
    """One needle request: its chat messages, the code planted, its length and the needle's depth in tokens."""

    messages: list[dict[str, str]]
    code: str
    prompt_tokens: int
    needle_tokens: int


def _case(spec: NeedleSpec, count: _Counter, target: int, depth: float, k: int) -> _Case:
    """The messages of one case, at most `target` prompt tokens as the server counts them."""
    place = spec.places[k % len(spec.places)]
    code = str(100000 + (k * 7919 + 4271) * 104729 % 900000)
    needle = spec.needle.format(place=place, code=code)
    question = spec.question.format(place=place)
    overhead = count.chat([{"role": "user", "content": needle + "\n\n" + question}])
    body = _filler(spec, count, max(0, target - overhead))
    while True:
        at = round(depth * len(body))
        text = " ".join([*body[:at], needle, *body[at:]])
        messages = [{"role": "user", "content": text + "\n\n" + question}]
        n = count.chat(messages)
        if n <= target or not body:
            break
        body = body[: -max(1, (n - target) // 16)]  # about 16 tokens a sentence: drop the excess, then recount
    prefix = " ".join(body[:at])
    return _Case(messages, code, n, count.text(prefix) if prefix else 0)


def run_needle(
    url: str, spec: NeedleSpec, model: str, api_key: str | None = None, max_len: int | None = None
) -> Needle:
    """Every (length, depth) case of `spec` through /v1/chat/completions; pass/fail per depth."""
    url = url.rstrip("/")
    count = _Counter(url, model, api_key)
    count.text(spec.filler[0])  # also reads the server's max_model_len
    promised = count.max_model_len
    if promised is None and max_len is None:
        raise BenchError(f"{url}/tokenize does not say the server's max_model_len", hint="pass --needle-max-len N")
    limit = min(x for x in (promised, max_len) if x) - spec.answer_tokens
    if limit < MIN_PROMPT_TOKENS:
        raise BenchError(
            f"the server's max_model_len {promised} leaves no needle case (a case needs "
            f"{MIN_PROMPT_TOKENS} prompt tokens + {spec.answer_tokens} for the answer)",
            hint="serve with a longer --max-model-len, or leave out --needle",
        )
    rows, k = [], 0
    for target in ladder(spec.min_tokens, limit):
        for depth in spec.depths:
            case = _case(spec, count, target, depth, k)
            k += 1
            rows.append(_ask(url, model, api_key, case, depth, spec.answer_tokens))
    passed = sum(r.passed for r in rows)
    return Needle(gate=spec.name, max_model_len=promised, limit=limit, depths=rows, passed=passed, total=len(rows))


def _ask(url: str, model: str, api_key: str | None, case: _Case, depth: float, answer: int) -> NeedleDepth:
    """One case asked: passed when the answer holds the code; `error` when the request or its answer failed."""
    body = {
        "model": model,
        "messages": case.messages,
        "temperature": 0.0,
        "max_tokens": answer,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    row = functools.partial(NeedleDepth, depth=depth, needle_tokens=case.needle_tokens, expect=case.code)
    try:
        r = fetch(f"{url}/v1/chat/completions", body, api_key=api_key, timeout=REQUEST_TIMEOUT)
    except HttpError as e:
        return row(prompt_tokens=case.prompt_tokens, passed=False, error=e.message)
    try:
        out = json.loads(r.text)
        text = out["choices"][0]["message"].get("content") or ""
        prompt_tokens = int(out.get("usage", {}).get("prompt_tokens", case.prompt_tokens))
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        error = f"answered {r.status}: {r.text[:160]}"
        return row(prompt_tokens=case.prompt_tokens, passed=False, error=error)
    return row(prompt_tokens=prompt_tokens, answer=text[:120], passed=case.code in text)


# why a run where no depth passed says so: the task asks a question in chat, which a base or tiny model cannot answer
NO_DEPTH_PASSED = (
    "no depth passed: the model never answered with the code. The needle task asks a question in "
    "chat, so it measures an instruction-following model; the demo's tiny model, trained on Python "
    "source only, misses every depth"
)


def needle_failures(needle: Needle) -> list[str]:
    """One line per failing depth (and NO_DEPTH_PASSED first when none passed)."""
    out = [NO_DEPTH_PASSED] if needle.depths and not needle.passed else []
    for r in needle.depths:
        if r.passed:
            continue
        why = r.error or f"answer {r.answer or ''!r} lacks {r.expect}"
        out.append(f"needle at depth {r.needle_tokens:,} of {r.prompt_tokens:,} tokens ({r.depth:g}): {why}")
    return out
