"""One streamed chat completion over the OpenAI API, timed on the client (stdlib http.client).

The clock: `t_sent` just before the request bytes go out, `t_first` when the first event with
text in any of `content`, `reasoning_content` or `reasoning` (or with token ids, where the request
asked vLLM for `return_token_ids`) arrives (a hidden reasoning phase counts: timing only `content`
is the classic 40% error on thinking models), `t_end` when the stream ends. Token counts come from
the server's `usage` (requested with `stream_options.include_usage`); a stream without it is an
error, never a guess. Beside usage the stream keeps its own ledger, the independent count the
cross-checks (checks.py) compare usage with: the events, the events that carried text, the token
ids streamed (exact where they come back), the reasoning tokens usage says it counted, and
whether `data: [DONE]` arrived (a stream that ends without it was cut: "connection closed after N
events").

The stall limit: a request fails when no token (an event with text or token ids) has arrived for
`stall_timeout` seconds, before the first token as after it; SSE comments (keep-alive pings) and
events without tokens are not progress.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from qwenquant.errors import BenchError
from qwenquant.net.http import HttpError, server_hint

TEXT_FIELDS = ("content", "reasoning_content", "reasoning")


@dataclass(frozen=True)
class Sample:
    """One timed request: client clock readings (perf_counter seconds) and the server's counts."""

    t_sent: float
    t_first: float | None
    t_end: float
    prompt_tokens: int
    completion_tokens: int
    max_tokens: int
    first_field: str | None
    chars: dict[str, int] = field(default_factory=dict)  # streamed characters per field
    finish_reason: str | None = None
    text_events: int = 0  # events that carried text: a decode rate over very few of them is coarse
    metrics: dict[str, Any] | None = None  # vLLM's per-request `metrics` on the usage chunk, where it sends them
    events: int = 0  # data events before `[DONE]`
    token_ids: int | None = None  # token ids streamed (vLLM's return_token_ids): None when none came back
    reasoning_tokens: int | None = None  # usage's completion_tokens_details.reasoning_tokens, where sent

    @property
    def exact(self) -> bool:
        """The stream's own token count is exact (token ids came back), not a floor of text events."""
        return self.token_ids is not None

    @property
    def streamed_tokens(self) -> int:
        """Tokens the stream carried: token ids where they came back, else events with text (a floor:
        an event may carry several tokens, e.g. a speculative step's)."""
        return self.token_ids if self.token_ids is not None else self.text_events

    @property
    def reasoning_streamed(self) -> bool:
        return any(self.chars.get(k, 0) for k in ("reasoning_content", "reasoning"))

    @property
    def short(self) -> bool:
        """The server stopped before max_tokens (it ignored or lacks `ignore_eos`)."""
        return self.completion_tokens < self.max_tokens


def sse_events(lines: Iterable[tuple[bytes, float]]) -> Iterator[tuple[str, float]]:
    """Server-sent events from (raw line, arrival time) pairs: yield (data, time of its first line).

    Follows the SSE rules that matter here: CRLF or LF endings, `:` comment lines, several
    `data:` lines joined by newlines, one optional space after the colon, blank line = dispatch.
    """
    data: list[str] = []
    t0: float | None = None
    for raw, t in lines:
        line = raw.decode("utf-8").rstrip("\r\n")
        if not line:
            if data:
                yield "\n".join(data), t0 if t0 is not None else t
            data, t0 = [], None
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "data":
            if t0 is None:
                t0 = t
            data.append(value)
    if data:  # a stream cut without the final blank line still delivers its last event
        yield "\n".join(data), t0 if t0 is not None else time.perf_counter()


class Ledger:
    """What a stream carried so far, beside usage: the clock of the last token (the stall limit's), the
    data events, whether `[DONE]` arrived. Shared by the line reader and the event fold."""

    def __init__(self, stall_timeout: float | None = None) -> None:
        self.stall_timeout = stall_timeout
        self.last_token = time.perf_counter()
        self.events = 0
        self.done = False

    def token(self) -> None:
        self.last_token = time.perf_counter()

    def left(self) -> float | None:
        """Seconds until the stall limit (None: no limit)."""
        if self.stall_timeout is None:
            return None
        return self.stall_timeout - (time.perf_counter() - self.last_token)

    def stalled(self) -> BenchError:
        return BenchError(
            f"stalled: no token from the server for {self.stall_timeout:g} s (after {self.events} events)",
            hint="see the server log; raise --stall-timeout for a slower server",
        )

    def closed(self, why: str = "") -> BenchError:
        return BenchError(
            f"connection closed after {self.events} events without `data: [DONE]`" + (f" ({why})" if why else ""),
            hint="the server (or a proxy) ended the stream early: see the server log",
        )


def _timed_lines(resp: http.client.HTTPResponse, sock: Any, ledger: Ledger) -> Iterator[tuple[bytes, float]]:
    """The response's lines with their arrival times; BenchError when no token came within the stall
    limit (bytes that are not tokens, such as keep-alive comments, do not reset it)."""
    while True:
        left = ledger.left()
        if left is not None:
            if left <= 0:
                raise ledger.stalled()
            sock.settimeout(left)
        try:
            line = resp.readline()
        except TimeoutError:
            raise ledger.stalled() from None
        if not line:
            return
        yield line, time.perf_counter()


def _text_fields(chunk: dict[str, Any]) -> dict[str, int]:
    """Characters of streamed text per field in one chunk (chat `delta` or completions `text`)."""
    out: dict[str, int] = {}
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta") or {}
        for name in TEXT_FIELDS:
            v = delta.get(name)
            if isinstance(v, str) and v:
                out[name] = out.get(name, 0) + len(v)
        if isinstance(choice.get("text"), str) and choice["text"]:
            out["content"] = out.get("content", 0) + len(choice["text"])
    return out


def _token_ids(chunk: dict[str, Any]) -> int | None:
    """Token ids one chunk carried (vLLM's return_token_ids), None when it carried no `token_ids` field."""
    found = [c.get("token_ids") for c in chunk.get("choices") or [] if isinstance(c, dict)]
    lists = [x for x in found if isinstance(x, list)]
    return sum(len(x) for x in lists) if lists else None


def chunk_tokens(chunk: dict[str, Any]) -> tuple[int, bool]:
    """(tokens one chunk carried, exact): its token ids where it has them, else one per choice with text (a floor)."""
    n, exact = 0, True
    for choice in chunk.get("choices") or []:
        if not isinstance(choice, dict):
            continue
        ids = choice.get("token_ids")
        if isinstance(ids, list):
            n += len(ids)
        elif _text_fields({"choices": [choice]}):
            n, exact = n + 1, False
    return n, exact


def _reasoning_tokens(usage: dict[str, Any]) -> int | None:
    details = usage.get("completion_tokens_details")
    n = details.get("reasoning_tokens") if isinstance(details, dict) else None
    return n if isinstance(n, int) else None


def read_stream(
    events: Iterable[tuple[str, float]],
    t_sent: float,
    max_tokens: int,
    on_chunk: Callable[[dict[str, Any]], None] | None = None,
    ledger: Ledger | None = None,
) -> Sample:
    """Fold a stream's events into a Sample (pure; raises BenchError on an error event, no usage, or
    a stream that ended without `[DONE]`). `on_chunk` sees each parsed chunk as it arrives (the soak
    counts tokens with it)."""
    led = ledger or Ledger()
    fold = _Fold()
    t_end = t_sent
    for data, t in events:
        t_end = t
        if data.strip() == "[DONE]":
            led.done = True
            break
        led.events += 1
        chunk = _chunk(data)
        if on_chunk is not None:
            on_chunk(chunk)
        fold.add(chunk, t, led)
    if not led.done:
        raise led.closed()
    usage = fold.usage
    if not usage or not isinstance(usage.get("completion_tokens"), int):
        raise BenchError(
            "the server streamed no token usage (stream_options.include_usage was requested): "
            "rates would have to be guessed, and qwenquant bench does not guess",
            hint="use a server that honours stream_options.include_usage (vLLM does)",
        )
    return Sample(
        t_sent,
        fold.t_first,
        t_end,
        int(usage.get("prompt_tokens") or 0),
        usage["completion_tokens"],
        max_tokens,
        fold.first_field,
        fold.chars,
        fold.finish,
        fold.n_text,
        fold.extra,
        led.events,
        fold.ids,
        _reasoning_tokens(usage),
    )


def _chunk(data: str) -> dict[str, Any]:
    """One event's JSON chunk (BenchError: not JSON, or the server's error)."""
    try:
        chunk: dict[str, Any] = json.loads(data)
    except ValueError:
        raise BenchError(
            f"the server streamed an event that is not JSON: {data[:200]!r}",
            hint="is this an OpenAI-compatible server?",
        ) from None
    if "error" in chunk:
        raise BenchError(
            f"the server reported an error mid-stream: {json.dumps(chunk['error'])[:300]}",
            hint="see the server log",
        )
    return chunk


@dataclass
class _Fold:
    """What a stream's chunks add up to so far: the first token's time and field, characters per text
    field, the events with text, the token ids, the finish reason, usage and the server's metrics."""

    t_first: float | None = None
    first_field: str | None = None
    chars: dict[str, int] = field(default_factory=dict)
    usage: dict[str, Any] | None = None
    finish: str | None = None
    extra: dict[str, Any] | None = None
    n_text: int = 0
    ids: int | None = None

    def add(self, chunk: dict[str, Any], t: float, led: Ledger) -> None:
        got, n_ids = _text_fields(chunk), _token_ids(chunk)
        if n_ids is not None:
            self.ids = (self.ids or 0) + n_ids
        self.n_text += bool(got)
        if got or n_ids:
            led.token()
            if self.t_first is None:
                self.t_first, self.first_field = t, next(iter(got), None)
        if got and self.first_field is None:
            self.first_field = next(iter(got))
        for k, n in got.items():
            self.chars[k] = self.chars.get(k, 0) + n
        for choice in chunk.get("choices") or []:
            self.finish = choice.get("finish_reason") or self.finish
        if chunk.get("usage"):
            self.usage = chunk["usage"]
            self.extra = chunk.get("metrics") if isinstance(chunk.get("metrics"), dict) else self.extra


def stream_chat(
    url: str,
    body: dict[str, Any],
    *,
    api_key: str | None = None,
    stall_timeout: float | None = 600.0,
    on_chunk: Callable[[dict[str, Any]], None] | None = None,
) -> Sample:
    """POST `body` (stream forced on, usage requested) to URL/v1/chat/completions; time it. Fails
    (BenchError) when no token arrives for `stall_timeout` seconds, or the stream is cut."""
    u = urllib.parse.urlsplit(url)
    conn_cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
    conn = conn_cls(u.hostname or "127.0.0.1", u.port, timeout=stall_timeout)
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    path = u.path.rstrip("/") + "/v1/chat/completions"
    payload = json.dumps(body).encode()
    ledger = Ledger(stall_timeout)
    try:
        conn.connect()  # outside the clock: the request time starts when the request is sent
        t_sent = ledger.last_token = time.perf_counter()
        conn.request("POST", path, body=payload, headers=headers)
        sock = conn.sock  # kept: a response that will close the connection drops conn.sock
        try:
            resp = conn.getresponse()
        except TimeoutError:
            raise ledger.stalled() from None
        if resp.status != 200:
            text = resp.read().decode(errors="replace")[:400]
            hint = server_hint(HttpError("", resp.status), api_key) if resp.status in (401, 403) else _hint_for(text)
            raise BenchError(f"{url}{path} answered {resp.status}: {text}", hint=hint)
        return read_stream(
            sse_events(_timed_lines(resp, sock, ledger)), t_sent, int(body.get("max_tokens") or 0), on_chunk, ledger
        )
    except (OSError, http.client.HTTPException) as e:
        if ledger.events:
            raise ledger.closed(str(e) or type(e).__name__) from None
        raise BenchError(f"request to {url}{path} failed: {e}", hint=server_hint(HttpError(""), api_key)) from None
    finally:
        conn.close()


def _hint_for(text: str) -> str:
    for flag, opt in (("ignore_eos", "--no-ignore-eos"), ("chat_template_kwargs", "--thinking default")):
        if flag in text:
            return f"the server refuses `{flag}`: run again with {opt}"
    return "see the server log"
