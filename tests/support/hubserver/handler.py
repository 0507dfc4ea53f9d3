"""The demo hub's download routes with the fault switches fired (faults.py) and the upload routes
(uploads.py) added."""

from __future__ import annotations

import socket
import struct
import time
from typing import Any

from qwenquant.testbed.hubserver.base import _Stop
from qwenquant.testbed.hubserver.handler import _Handler
from qwenquant.testbed.hubserver.repos import HubFile

from support.hubserver.faults import BODY_KINDS, Fault
from support.hubserver.uploads import handle as handle_upload


class FaultyHandler(_Handler):
    BODY_KINDS = frozenset(BODY_KINDS)

    def do_POST(self) -> None:
        handle_upload(self, "POST")

    def do_PUT(self) -> None:
        handle_upload(self, "PUT")

    def faults(self, kinds: set[str] | frozenset[str], *, repo_id: str, path: str, method: str) -> dict[str, Any]:
        fired = self.hub.faults.take(kinds, repo_id=repo_id, path=path, method=method, has_range=bool(self._rec.range))
        return {f.kind: f for f in fired}

    def _send_file(self, method: str, f: HubFile, headers: dict[str, str], fired: dict[str, Any]) -> None:
        if not fired:
            return super()._send_file(method, f, headers, fired)
        shift = fired["bad_content_range"].shift if "bad_content_range" in fired else 0
        span = self._send_headers(f, headers, ignore_range="ignore_range" in fired, shift=shift)
        if span is None or method == "HEAD":
            return None
        start, end = span
        stop_at = _stop_at(fired, start, end)
        flip = None
        if "corrupt" in fired:
            at = fired["corrupt"].at
            flip = min(max(start, at if at is not None else f.size // 2), end - 1)
        rate = fired["slow"].rate if "slow" in fired else None
        self._stream(f, start, stop_at, flip, rate)
        if stop_at < end:
            if "close" in fired:  # RST instead of FIN: the client sees "connection reset"
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            raise _Stop()
        return None

    def _stream(self, f: HubFile, start: int, stop_at: int, flip: int | None, rate: int | None) -> None:
        """Bytes [start, stop_at) of `f`, the byte at `flip` inverted, at `rate` bytes/s."""
        rec = self._rec
        with open(f.source, "rb") as src:
            src.seek(start)
            pos = start
            t0 = time.monotonic()
            step = max(1, min(1 << 20, rate // 10)) if rate else 1 << 20
            while pos < stop_at:
                chunk = bytearray(src.read(min(step, stop_at - pos)))
                if not chunk:
                    break
                if flip is not None and pos <= flip < pos + len(chunk):
                    chunk[flip - pos] ^= 0xFF
                self.wfile.write(chunk)
                pos += len(chunk)
                rec.sent = pos - start
                if rate:
                    ahead = (pos - start) / rate - (time.monotonic() - t0)
                    if ahead > 0:
                        time.sleep(ahead)


def _stop_at(fired: dict[str, Fault], start: int, end: int) -> int:
    """Where a truncate or close fault cuts the body (its `at`, default half way), else `end`."""
    stop_at = end
    for kind in ("truncate", "close"):
        if kind in fired:
            at = fired[kind].at
            stop_at = min(end, max(start, at if at is not None else start + (end - start) // 2))
    return stop_at
