"""The one small HTTP client for JSON and text (standard library only): serve's readiness probe,
the served eval gate, bench's model lookup and /metrics scrapes, the demo's completion.

Every failure is an HttpError that says which request failed and why: no answer at all (`status`
None: refused, timed out, reset) or an HTTP error status (`status` and the start of the body).
`fetch` returns any status instead, for callers that decide on the status themselves.
Streaming is elsewhere (bench/stream.py times bytes with http.client).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from qwenquant.errors import QwenquantError

DEFAULT_TIMEOUT = 30.0


class HttpError(QwenquantError):
    """A request that got no usable answer; `status` is None when the server did not answer at all."""

    def __init__(self, message: str, status: int | None = None, body: str = "") -> None:
        super().__init__(message, hint="check that the server is up and the URL is right")
        self.status = status
        self.body = body


def server_hint(e: HttpError, api_key: str | None) -> str:
    """The next step for a failed request to a server (bench's and eval's): an API key for 401/403, the URL
    for another status, the server itself when nothing answered."""
    if e.status in (401, 403):
        return (
            "the server refused the API key: pass the key it was started with (--api-key or QWENQUANT_API_KEY)"
            if api_key
            else "the server wants an API key: pass --api-key KEY (or set QWENQUANT_API_KEY)"
        )
    if e.status is not None:
        return "check that the URL is the server's base URL (http://HOST:PORT) of an OpenAI-compatible server"
    return "check the server is up (`qwenquant serve ...` prints ready)"


def check_url(url: str, what: str) -> str:
    """`url` when it is http(s)://HOST[:PORT][/path] with a port in range; a UsageError (exit 2)
    naming `what` otherwise (a URL without a scheme is the usual slip)."""
    from urllib.parse import urlsplit

    from qwenquant.errors import UsageError

    hint = "a base URL such as http://127.0.0.1:8000"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as e:
        raise UsageError(f"{what} {url!r} is not a URL ({e})", hint=hint) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"{what} {url!r} needs http:// or https:// and a host", hint=hint)
    if port == 0:
        raise UsageError(f"{what} {url!r}: port 0 is not a server's port", hint=hint)
    return url


@dataclass(frozen=True)
class Response:
    status: int
    text: str


def _request(url: str, body: Any, api_key: str | None) -> urllib.request.Request:
    headers = {"Content-Type": "application/json"} if body is not None else {}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    data = None if body is None else json.dumps(body).encode()
    return urllib.request.Request(url, data=data, headers=headers, method="GET" if data is None else "POST")


def fetch(url: str, body: Any = None, *, api_key: str | None = None, timeout: float = DEFAULT_TIMEOUT) -> Response:
    """GET `url` (POST `body` as JSON when given) and return the answer, whatever its status;
    HttpError (status None) when the server does not answer."""
    method = "GET" if body is None else "POST"
    try:
        with urllib.request.urlopen(_request(url, body, api_key), timeout=timeout) as r:
            return Response(r.status, r.read().decode(errors="replace"))
    except urllib.error.HTTPError as e:
        return Response(e.code, e.read().decode(errors="replace"))
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", None) or e
        raise HttpError(f"{method} {url} got no answer: {reason}") from None


def _ok(url: str, r: Response, method: str) -> str:
    if not 200 <= r.status < 300:
        raise HttpError(f"{method} {url} answered {r.status}: {r.text[:200]}", r.status, r.text)
    return r.text


def _json(url: str, text: str, method: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        raise HttpError(f"{method} {url} answered with something that is not JSON: {text[:200]}") from None


def get_text(url: str, *, api_key: str | None = None, timeout: float = DEFAULT_TIMEOUT) -> str:
    """The body of a 2xx answer to GET `url`."""
    return _ok(url, fetch(url, api_key=api_key, timeout=timeout), "GET")


def get_json(url: str, *, api_key: str | None = None, timeout: float = DEFAULT_TIMEOUT) -> Any:
    """The JSON of a 2xx answer to GET `url`."""
    return _json(url, get_text(url, api_key=api_key, timeout=timeout), "GET")


def post_json(url: str, body: Any, *, api_key: str | None = None, timeout: float = DEFAULT_TIMEOUT) -> Any:
    """POST `body` as JSON; the JSON of a 2xx answer."""
    return _json(url, _ok(url, fetch(url, body, api_key=api_key, timeout=timeout), "POST"), "POST")
