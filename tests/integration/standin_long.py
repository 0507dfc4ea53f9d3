"""The stand-in OpenAI server (standin.py) with what `bench --depth` and `bench --soak` read, and the
faults they must catch.

STAND-IN, not vLLM: a real vLLM cannot be told to fail at a chosen depth, to stop accepting drafts
after N generated tokens, or to restart mid-run. Over StandinServer it adds: prompt tokens counted
from the prompt's characters (`chars_per_token`, plus `template_tokens`), POST /tokenize (unless
`tokenize` is False), max_model_len on /v1/models (a longer request gets vLLM's 400), streams in
speculative steps after the prefill's token (each chunk carries the step's tokens, `token_ids` with
return_token_ids: 1 target token + `accepted` drafts of 3, 0 accepted after `collapse_after` generated
tokens), counters that
grow per step, vLLM's prefix-cache counters (`prefix_cache`: on counts the tokens of the leading
messages a request repeats from the one before as hits, off never hits, absent has no counters), vLLM's per-request `metrics.speculative_decoding` (detailed) on the usage chunk when
`per_request` is set, and `process_start_time_seconds` on /metrics.

Faults: `fail_depth` (a prompt of at least that many tokens) with `fail_mode` http (500) | oom (an
out-of-memory line on stdout, the server log under `qwenquant serve`, then 500) | stall (no answer) |
die (the process exits 3) | empty (no tokens), only the first `fail_count` such requests where set
(part of a burst), cut (two token chunks, then the connection closes with no `[DONE]`) | ping (SSE
keep-alive comments every 50 ms and never a token); `restart_after` (after that many generated tokens
the process start time moves and the counters start again, as after a restart). Counts that lie:
`hidden` (the first that many tokens are generated, counted in usage, and never streamed, token ids
included, as vLLM does for reasoning with include_reasoning off; `reasoning_details` adds usage's
reasoning_tokens), `usage_delta` (usage counts that many completion tokens more, or fewer),
`token_ids` False (no token ids even when asked), `usage_prompt_scale` (usage counts the prompt at
that multiple of what /tokenize says), `short_by` (the stream ends, `[DONE]` and all, that many
tokens before max_tokens; usage counts the streamed tokens plus `usage_delta`). `mtp` False: no
speculative decoding (one token per chunk, the counters never move). `max_num_seqs`: listed on
/v1/models when set.

As vLLM: `python standin_long.py` takes standin.py's flags and --standin-fail-depth N,
--standin-fail-mode M, --standin-max-model-len N, --standin-collapse-after N, --standin-fail-count N,
--standin-prefix-cache on|off|absent; `write_long_vllm`
writes its launcher.
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import standin
from standin import Counters, StandinServer, _Handler


class LongStandin(StandinServer):
    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, verbose: bool = False) -> None:
        super().__init__(host, port, verbose=verbose)
        self.httpd.RequestHandlerClass = type("LongHandler", (_LongHandler,), {"s": self})
        self.chars_per_token = 4.0
        self.template_tokens = 10
        self.tokenize = True
        self.max_model_len = 4096
        self.accepted = 2  # drafts accepted per step (of 3)
        self.collapse_after: int | None = None
        self.per_request = False
        self.fail_depth: int | None = None
        self.fail_mode = "http"
        self.restart_after: int | None = None
        self.start_time = 1.7e9
        self.step = 0.002
        self.generated = 0  # all streams together
        self.fail_count: int | None = None  # only this many requests at fail_depth fail (a burst's first ones)
        self.prefix_cache = "on"  # on: hits for the messages a request repeats | off: no hits | absent: no counters
        self.cache = {"queries": 0, "hits": 0, "last": []}
        self.reasoning_details = False
        self.token_ids = True
        self.usage_prompt_scale = 1.0
        self.short_by = 0
        self.max_num_seqs: int | None = None  # listed on /v1/models when set (vLLM does not list it)
        self.run_limit: int | None = None  # streams run at once; the rest wait, counted as vLLM's gauges count them
        self.queue = {"running": 0, "waiting": 0}
        self._slots: threading.Semaphore | None = None
        self.mtp = True

    def prompt_tokens(self, body: dict[str, Any]) -> int:
        chars = sum(len(m.get("content") or "") for m in body.get("messages") or [])
        return math.ceil(chars / self.chars_per_token) + self.template_tokens

    def metrics_text(self) -> str:
        page = super().metrics_text() + f"process_start_time_seconds {self.start_time}\n"
        if self.run_limit is not None:
            page += (
                f'vllm:num_requests_running{{engine="0"}} {self.queue["running"]}\n'
                f'vllm:num_requests_waiting{{engine="0"}} {self.queue["waiting"]}\n'
            )
        if self.prefix_cache != "absent":
            page += (
                f'vllm:prefix_cache_queries_total{{engine="0"}} {self.cache["queries"]}\n'
                f'vllm:prefix_cache_hits_total{{engine="0"}} {self.cache["hits"]}\n'
            )
        return page

    def count_cache(self, body: dict[str, Any], n: int) -> None:
        """Queries: the prompt's tokens; hits: the tokens of the leading messages the previous request had too."""
        msgs = body.get("messages") or []
        with self.lock:
            last, same = self.cache["last"], 0
            while same < min(len(msgs), len(last)) and msgs[same] == last[same]:
                same += 1
            chars = sum(len(m.get("content") or "") for m in msgs[:same])
            self.cache["queries"] += n
            self.cache["hits"] += int(chars / self.chars_per_token) if self.prefix_cache == "on" else 0
            self.cache["last"] = msgs

    def take_fault(self, n: int) -> bool:
        """Whether a request of `n` prompt tokens fails (fail_count limits how many do)."""
        with self.lock:
            if self.fail_depth is None or n < self.fail_depth or self.fail_count == 0:
                return False
            if self.fail_count is not None:
                self.fail_count -= 1
            return True

    def spec_step(self, accepted: int) -> None:
        if not self.mtp:
            with self.lock:
                self.generated += 1
            return
        with self.lock:
            c = self.counters
            c.drafts, c.draft_tokens, c.accepted = c.drafts + 1, c.draft_tokens + 3, c.accepted + accepted
            c.per_pos = [v + (1 if i < accepted else 0) for i, v in enumerate(c.per_pos)]
            self.generated += accepted + 1
            if self.restart_after is not None and self.generated >= self.restart_after:
                self.restart_after, self.start_time, self.counters = None, self.start_time + 100.0, Counters()


class _LongHandler(_Handler):
    s: LongStandin

    def do_GET(self) -> None:
        if self.path == "/v1/models" and self._authorized():
            card = {
                "id": self.s.model,
                "object": "model",
                "root": self.s.root,
                "owned_by": "vllm",
                "max_model_len": self.s.max_model_len,
            }
            if self.s.max_num_seqs is not None:
                card["max_num_seqs"] = self.s.max_num_seqs
            self._send(200, {"object": "list", "data": [card]})
        elif self.path != "/v1/models":
            super().do_GET()

    def do_POST(self) -> None:
        if self.path not in ("/tokenize", "/v1/chat/completions"):
            super().do_POST()
            return
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        n = self.s.prompt_tokens(body)
        if self.path == "/tokenize":
            if self.s.tokenize:
                self._send(200, {"count": n, "max_model_len": self.s.max_model_len, "tokens": []})
            else:
                self._send(404, {"detail": "Not Found"})
            return
        with self.s.lock:
            self.s.bodies.append(body)
        out = int(body.get("max_tokens") or self.s.tokens)
        if n + out > self.s.max_model_len:
            self._send(
                400,
                {
                    "error": {
                        "message": f"This model's maximum context length is {self.s.max_model_len} "
                        f"tokens. However, you requested {n + out} tokens",
                        "code": 400,
                    }
                },
            )
            return
        self.s.count_cache(body, n)
        fault = self.s.take_fault(n)
        if fault and self._fail():
            return
        if self.s.run_limit is None:
            self._spec_stream(body, n, 0 if fault else out)
            return
        with self.s.lock:
            self.s._slots = self.s._slots or threading.Semaphore(self.s.run_limit)
            self.s.queue["waiting"] += 1
        with self.s._slots:
            with self.s.lock:
                self.s.queue["waiting"] -= 1
                self.s.queue["running"] += 1
            try:
                self._spec_stream(body, n, 0 if fault else out)
            finally:
                with self.s.lock:
                    self.s.queue["running"] -= 1

    def _fail(self) -> bool:
        """The fault at depth; False when the stream goes on (mode `empty`)."""
        mode = self.s.fail_mode
        if mode == "oom":
            print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (stand-in)", flush=True)
        if mode in ("http", "oom"):
            self._send(500, {"error": {"message": "EngineCore encountered an issue (stand-in)", "code": 500}})
        elif mode == "stall":
            time.sleep(3600)
        elif mode in ("cut", "ping"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            if mode == "ping":
                self._keepalive()
                return True
            for i in range(2):
                self._event(
                    {
                        "id": "x",
                        "object": "chat.completion.chunk",
                        "model": self.s.model,
                        "choices": [{"index": 0, "delta": {"content": f"w{i} "}, "token_ids": [i]}],
                    }
                )
            self.close_connection = True
        elif mode == "die":
            print("standin: dying at depth", flush=True)
            os._exit(3)
        return mode != "empty"

    def _spec_stream(self, body: dict[str, Any], prompt: int, n: int) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        base = {"id": "x", "object": "chat.completion.chunk", "model": self.s.model}
        ids = bool(body.get("return_token_ids")) and self.s.token_ids
        n = max(0, n - self.s.short_by)
        done, steps = 0, []
        t0 = time.perf_counter() + self.s.ttft
        if n and self.s.hidden:  # generated and counted, never streamed (no chunk, no token ids)
            done = min(n, self.s.hidden)
            t0 += done * self.s.step
            ids = False
        if n and not done:  # the prefill's token, as vLLM: no verify step
            time.sleep(max(0.0, t0 - time.perf_counter()))
            choice0: dict[str, Any] = {"index": 0, "delta": {"content": "w "}, "finish_reason": None}
            self._event({**base, "choices": [{**choice0, "token_ids": [0]} if ids else choice0]})
            done, t0 = 1, t0 + self.s.step
        while done < n:
            time.sleep(max(0.0, t0 + len(steps) * self.s.step - time.perf_counter()))
            collapsed = self.s.collapse_after is not None and done >= self.s.collapse_after
            a = min(0 if collapsed or not self.s.mtp else self.s.accepted, max(0, n - done - 1))
            self.s.spec_step(a)
            steps.append(a)
            choice: dict[str, Any] = {"index": 0, "delta": {"content": "w " * (a + 1)}, "finish_reason": None}
            if ids:
                choice["token_ids"] = list(range(done, done + a + 1))
            self._event({**base, "choices": [choice]})
            done += a + 1
        self._event({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
        shown = n + self.s.usage_delta
        prompt = int(prompt * self.s.usage_prompt_scale)
        usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": shown, "total_tokens": prompt + shown}
        if self.s.reasoning_details:
            usage["completion_tokens_details"] = {"reasoning_tokens": self.s.hidden}
        last: dict[str, Any] = {**base, "choices": [], "usage": usage}
        if self.s.per_request:
            last["metrics"] = {
                "speculative_decoding": {
                    "mean_acceptance_length": 1 + sum(steps) / max(1, len(steps)),
                    "num_spec_tokens": 3,
                    "num_draft_tokens": 3 * len(steps),
                    "per_step_accepted": steps,
                    "per_step_drafted": [3] * len(steps),
                }
            }
        self._event(last)
        self._event("[DONE]")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


def write_long_vllm(root: Path) -> Path:
    """standin.write_fake_vllm's launcher, its entrypoint this file."""
    launcher = standin.write_fake_vllm(root)
    d = json.loads(launcher.read_text())
    d["entrypoint"] = [sys.executable, str(Path(__file__))]
    launcher.write_text(json.dumps(d))
    return launcher


def main(argv: list[str]) -> int:
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("--standin-fail-depth", type=int, default=None)
    p.add_argument("--standin-fail-mode", default="http")
    p.add_argument("--standin-max-model-len", type=int, default=4096)
    p.add_argument("--standin-collapse-after", type=int, default=None)
    p.add_argument("--standin-fail-count", type=int, default=None)
    p.add_argument("--standin-prefix-cache", default="on")
    mine, rest = p.parse_known_args(argv)
    a = standin.parse(rest)
    print(f"standin_long: model={a.model} port={a.port} argv={argv}", flush=True)
    s = LongStandin(a.host, a.port, verbose=True)
    s.model, s.root, s.api_key = a.served_model_name or a.model, a.model, a.api_key
    s.fail_depth, s.fail_mode = mine.standin_fail_depth, mine.standin_fail_mode
    s.max_model_len, s.collapse_after = mine.standin_max_model_len, mine.standin_collapse_after
    s.fail_count, s.prefix_cache = mine.standin_fail_count, mine.standin_prefix_cache
    threading.Thread(target=s.httpd.serve_forever, daemon=True).start()
    print(f"standin_long: listening on {a.host}:{a.port}", flush=True)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
