"""What every route of the loopback hub shares: the request log entry, the abort signal, the JSON and
error responses. handler.py (downloads) and uploads.py (writes) both build on it, so neither imports
the other's module for them."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

log = logging.getLogger(__name__)


@dataclass
class LoggedRequest:
    """One request as the server saw it (for tests to assert what was downloaded)."""

    method: str
    path: str
    endpoint: str  # "info" | "tree" | "resolve" | "blob" | an upload route (uploads.py) | "unknown"
    repo_id: str | None = None
    revision: str | None = None
    file: str | None = None
    range: str | None = None
    status: int = 0
    start: int | None = None  # byte span of the body the server meant to send
    end: int | None = None
    sent: int = 0  # body bytes actually written
    faults: list[str] = field(default_factory=list)
    host: str | None = None  # the Host header: 127.0.0.1 for the Hub, localhost for the "CDN"
    authorized: bool = False  # an Authorization header came with it (must never reach the CDN)


class _Stop(Exception):
    """Abort the response (connection closed on purpose or by the peer)."""


class BaseHandler(BaseHTTPRequestHandler):
    """The responses every route writes; `hub` is the HubServer (server.py) whose class-per-server
    subclass serves this request (typed loosely: server.py imports the handlers)."""

    hub: Any
    _rec: LoggedRequest
    protocol_version = "HTTP/1.1"
    server_version = "qwenquant-hubserver"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def _error(self, status: int, code: str | None, message: str, commit: str | None = None) -> None:
        body = json.dumps({"error": message}).encode()
        self.send_response(status)
        if code:
            self.send_header("X-Error-Code", code)
            self.send_header("X-Error-Message", message)
        if commit:
            self.send_header("X-Repo-Commit", commit)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        self._rec.status = status

    def _json(self, status: int, obj: Any, commit: str | None = None, extra: dict[str, str] | None = None) -> None:
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if commit:
            self.send_header("X-Repo-Commit", commit)
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        self._rec.status = status
