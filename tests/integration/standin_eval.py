"""The stand-in server (standin.py) with the faults `qwenquant eval served` must name: a /metrics
that answers another status, a /v1/models body without `data`, and chat answers that draft (as vLLM
with MTP drafts on every request, chat ones included).

STAND-IN, not vLLM: a real vLLM always serves /metrics and a well-formed /v1/models, and a test
cannot choose how many drafts it accepts. Same switches as StandinServer, plus:
  metrics_status  None: /metrics as usual; a status (404): /metrics answers it
  models_body     None: /v1/models as usual; any JSON: /v1/models answers it (200)
  chat_drafts     True: every non-streamed chat completion grows the counters by `spec`
"""

from __future__ import annotations

from typing import Any

from standin import StandinServer, _Handler


class _EvalHandler(_Handler):
    s: EvalStandin

    def do_GET(self) -> None:
        if self.path == "/metrics" and self.s.metrics_status is not None:
            self._send(self.s.metrics_status, {"error": "not here"})
        elif self.path == "/v1/models" and self.s.models_body is not None:
            if self._authorized():
                self._send(200, self.s.models_body)
        else:
            super().do_GET()

    def do_POST(self) -> None:
        if self.path == "/v1/chat/completions" and self.s.chat_drafts:
            self.s.count()
        super().do_POST()


class EvalStandin(StandinServer):
    """`with EvalStandin() as s:` as StandinServer, with the switches above."""

    def __init__(self) -> None:
        super().__init__()
        self.metrics_status: int | None = None
        self.models_body: Any = None
        self.chat_drafts = False
        self.httpd.RequestHandlerClass = type("EvalHandler", (_EvalHandler,), {"s": self})
