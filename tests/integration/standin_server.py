"""A stand-in for vLLM's OpenAI server, for failure tests: a real vLLM does not fail on demand.

Accepts vLLM's flags (--model, --host, --port, --served-model-name, --api-key; the rest ignored)
and behaves as `--standin-mode` says:
  good           serve /health, /v1/models, /v1/completions like vLLM; SIGTERM exits 0
  exit0          exit 0 at once            exit1       print a traceback-ish line, exit 1
  nobind         stay alive, never listen  health503   listen, /health answers 503 forever
  fatal-hang     print a vLLM worker's fatal error line, then stay alive and never listen (as
                 vLLM 0.26's API server did after a tensor-parallel worker died)
  die-after-ready  serve, then exit 3 one second after the first completion
  wrong-root     /v1/models lists the served name with a different root
`--standin-pidfile F` writes "server_pid helper_pid": the server starts a helper child (as vLLM
starts its engine process) so tests can check the whole process group is gone.
`--standin-envfile F` writes the server's environment as JSON (what a child of `qwenquant serve` gets).
`--standin-stubborn-helper`: the helper ignores SIGTERM and the server leaves it behind when it
exits (an engine core that is busy or wedged): only a SIGKILL of the group removes it.
`--standin-answers F`: completions answer from the JSON prompt -> text table in F (else " world").
/metrics: vLLM's speculative-decoding counters, starting at METRICS_START and growing by
METRICS_STEP per completion after the first (the readiness probe's), so acceptance figures
computed from their deltas are known exactly.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


# drafts, draft tokens, accepted tokens, accepted per position 0/1/2
METRICS_START = (100.0, 300.0, 50.0, (30.0, 15.0, 5.0))
METRICS_STEP = (4.0, 12.0, 6.0, (3.0, 2.0, 1.0))


def metrics_text(completions: int) -> str:
    """A Prometheus page with the spec-decode counters after `completions` counted completions."""
    v = [METRICS_START[i] + completions * METRICS_STEP[i] for i in range(3)]
    lab = 'engine="0",model_name="m"'
    lines = [f"vllm:spec_decode_num_drafts_total{{{lab}}} {v[0]}", f"vllm:spec_decode_num_draft_tokens_total{{{lab}}} {v[1]}",
             f"vllm:spec_decode_num_accepted_tokens_total{{{lab}}} {v[2]}"]
    lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="{p}"}} '
              f"{METRICS_START[3][p] + completions * METRICS_STEP[3][p]}" for p in range(3)]
    return "\n".join(lines) + "\n"


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--api-key", default=None)
    p.add_argument("--standin-mode", default="good")
    p.add_argument("--standin-pidfile", default=None)
    p.add_argument("--standin-envfile", default=None)
    p.add_argument("--standin-stubborn-helper", action="store_true")
    p.add_argument("--standin-answers", default=None)
    args, _unknown = p.parse_known_args(argv)
    return args


def main(argv: list[str]) -> int:
    a = parse(argv)
    name = a.served_model_name or a.model
    print(f"standin: mode={a.standin_mode} model={a.model} port={a.port} argv={argv}", flush=True)
    if a.standin_envfile:
        with open(a.standin_envfile, "w") as f:
            json.dump(dict(os.environ), f)
    code = "import time; time.sleep(600)"
    if a.standin_stubborn_helper:
        code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
    helper = subprocess.Popen([sys.executable, "-c", code])
    if a.standin_pidfile:
        with open(a.standin_pidfile, "w") as f:
            f.write(f"{os.getpid()} {helper.pid}\n")
    mode = a.standin_mode
    if mode == "exit0":
        print("standin: nothing to do, exiting 0", flush=True)
        helper.kill()
        return 0
    if mode == "exit1":
        print("RuntimeError: standin failed to load the model", flush=True)
        helper.kill()
        return 1
    if a.standin_stubborn_helper:
        signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    else:
        signal.signal(signal.SIGTERM, lambda *_: (helper.kill(), os._exit(0)))
    if mode == "fatal-hang":
        print("(Worker_TP1 pid=7) ERROR [multiproc_executor.py:1007] WorkerProc hit an exception.", flush=True)
    if mode in ("nobind", "fatal-hang"):
        while True:
            time.sleep(1)
    root = "/somewhere/else" if mode == "wrong-root" else a.model
    answers = json.loads(open(a.standin_answers).read()) if a.standin_answers else {}
    completions = [0]

    class H(BaseHTTPRequestHandler):
        def log_message(self, fmt: str, *args: object) -> None:
            print("standin http: " + fmt % args, flush=True)

        def _send(self, code: int, obj: object) -> None:
            body = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _authorized(self) -> bool:
            if a.api_key and self.headers.get("Authorization") != f"Bearer {a.api_key}":
                self._send(401, {"error": "Unauthorized"})
                return False
            return True

        def do_GET(self) -> None:
            if self.path == "/health":
                self._send(503 if mode == "health503" else 200, {})
            elif self.path == "/metrics":
                body = metrics_text(max(0, completions[0] - 1)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            elif self.path == "/v1/models":
                if self._authorized():
                    self._send(200, {"object": "list", "data": [
                        {"id": name, "object": "model", "root": root, "owned_by": "vllm"}]})
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self) -> None:
            n = int(self.headers.get("Content-Length") or 0)
            req = json.loads(self.rfile.read(n) or b"{}")
            if self.path == "/v1/completions" and self._authorized():
                if req.get("model") != name:
                    self._send(404, {"error": f"model {req.get('model')} not found"})
                    return
                completions[0] += 1
                text = answers.get(req.get("prompt"), " world")
                self._send(200, {"id": "cmpl-standin", "object": "text_completion", "model": name,
                                 "choices": [{"index": 0, "text": text, "finish_reason": "length"}]})
                if mode == "die-after-ready":
                    threading.Timer(1.0, lambda: (print("standin: dying", flush=True), helper.kill(),
                                                  os._exit(3))).start()
            elif self.path != "/v1/completions":
                self._send(404, {"error": "not found"})

    server = ThreadingHTTPServer((a.host, a.port), H)
    print(f"standin: listening on {a.host}:{a.port}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
