"""A stand-in OpenAI-compatible streaming server for `qwenquant bench` tests.

A stand-in, not vLLM: the figures under test depend on when each byte is sent, and a real server
cannot be told to wait 300 ms before its first token or to hide a reasoning phase. It is a real
HTTP server on a loopback port 0 (ThreadingHTTPServer) that streams SSE like vLLM and records,
on its own clock, when each request arrived, when its first text left and when its stream ended,
so a test can hold the client's figures against the server's.

Switches (attributes of the StandinServer):
  field        the delta field that carries text: content | reasoning_content | reasoning
  hidden       tokens of a reasoning phase that streams no text at all (counted in usage)
  usage        False: the stream carries no usage (the client must refuse to guess)
  ttft, step   seconds before the first chunk, between chunks (scheduled on absolute times)
  tokens       completion tokens per request (max_tokens when the request sets it)
  spec         per-request increments of the vllm:spec_decode_* counters on /metrics
  noisy        the first `noisy` requests add wildly different counters (warm-up must not count)
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Optional

PROMPT_TOKENS = 120


@dataclass
class Record:
    """Server-side clock of one request (perf_counter, same monotonic clock as the client's)."""

    recv: float
    first: Optional[float] = None
    done: Optional[float] = None
    tokens: int = 0


@dataclass
class Counters:
    drafts: float = 100.0  # nonzero at start: only deltas may be used
    draft_tokens: float = 300.0
    accepted: float = 50.0
    per_pos: list[float] = field(default_factory=lambda: [30.0, 15.0, 5.0])


class StandinServer:
    """Start with `with StandinServer() as s:`; s.url; switches as attributes; s.records."""

    def __init__(self) -> None:
        self.field = "content"
        self.hidden = 0
        self.usage = True
        self.ttft = 0.05
        self.step = 0.02
        self.tokens = 40
        self.spec = (10.0, 30.0, 20.0, [9.0, 7.0, 4.0])  # drafts, draft tokens, accepted, per position
        self.noisy = 0
        self.records: list[Record] = []
        self.counters = Counters()
        self.lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> "StandinServer":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def count(self) -> None:
        with self.lock:
            n = len(self.records)
            d, dt, a, pos = self.spec if n > self.noisy else (1.0, 3.0, 3.0, [1.0, 1.0, 1.0])
            c = self.counters
            c.drafts, c.draft_tokens, c.accepted = c.drafts + d, c.draft_tokens + dt, c.accepted + a
            c.per_pos = [x + y for x, y in zip(c.per_pos, pos)]

    def metrics_text(self) -> str:
        c = self.counters
        labels = 'engine="0",model_name="stand\\"in"'
        lines = ["# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.",
                 "# TYPE vllm:spec_decode_num_drafts_total counter",
                 f"vllm:spec_decode_num_drafts_total{{{labels}}} {c.drafts}",
                 f"vllm:spec_decode_num_drafts_created{{{labels}}} 1.7e9",
                 f"vllm:spec_decode_num_draft_tokens_total{{{labels}}} {c.draft_tokens}",
                 f"vllm:spec_decode_num_accepted_tokens_total{{{labels}}} {c.accepted}",
                 'vllm:num_requests_running{engine="0"} 0.0']
        lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="{i}"}} {v}'
                  for i, v in enumerate(c.per_pos)]
        return "\n".join(lines) + "\n"


def _handler(s: StandinServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a: Any) -> None:
            pass

        def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/v1/models":
                self._send(200, json.dumps({"object": "list", "data": [{"id": "standin", "root": "/x"}]}).encode())
            elif self.path == "/version":
                self._send(200, b'{"version": "0.0.0-standin"}')
            elif self.path == "/metrics":
                self._send(200, s.metrics_text().encode(), "text/plain; version=0.0.4")
            else:
                self._send(404, b"{}")

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            rec = Record(recv=time.perf_counter())
            with s.lock:
                s.records.append(rec)
            s.count()
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self._stream(body, rec)

        def _event(self, obj: Any) -> None:
            data = (f"data: {obj}\n\n" if isinstance(obj, str) else f"data: {json.dumps(obj)}\n\n").encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def _stream(self, body: dict[str, Any], rec: Record) -> None:
            n = int(body.get("max_tokens") or s.tokens)
            base = {"id": "x", "object": "chat.completion.chunk", "model": "standin"}
            self._event({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
                         "usage": None})
            for i in range(n):
                time.sleep(max(0.0, rec.recv + s.ttft + i * s.step - time.perf_counter()))
                # a hidden phase still sends chunks, with no text in any field
                delta = {} if i < s.hidden else {s.field: f"w{i} "}
                self._event({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
                if delta and rec.first is None:
                    rec.first = time.perf_counter()
            self._event({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
            if s.usage:
                self._event({**base, "choices": [], "usage": {"prompt_tokens": PROMPT_TOKENS,
                                                               "completion_tokens": n, "total_tokens": n + 120}})
            self._event("[DONE]")
            rec.done, rec.tokens = time.perf_counter(), n
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

    return Handler
