"""The stand-in OpenAI server of the tests, run in the test process or as vLLM, and its serving setup.

STAND-IN, not vLLM: a real vLLM cannot be told to wait 300 ms before its first token, hide a
reasoning phase, accept a chosen number of drafts, answer fixed texts, or fail on demand. It is a
real HTTP server (ThreadingHTTPServer) that answers /health, /version, /v1/models,
/v1/completions (JSON), /v1/chat/completions (SSE, like vLLM) and /metrics (vLLM's
speculative-decoding counters), and records on its own clock when each stream started and ended.

In the test process: `with StandinServer() as s:` (loopback, port 0), switches as attributes:
  model, root     the served name and the root /v1/models lists
  api_key         required on /v1/* when set (401 otherwise)
  health          /health's status (503: never healthy)
  answers         prompt -> completion text (default " world")
  field           the delta field that carries streamed text: content | reasoning_content | reasoning
  hidden          streamed tokens of a reasoning phase with no text at all (counted in usage)
  reasoning_details  usage carries completion_tokens_details.reasoning_tokens = hidden (as vLLM with a
                  reasoning parser does)
  usage_delta     usage counts this many completion tokens more (negative: fewer) than were streamed
  cut_after       the stream ends after this many token chunks with no `[DONE]` (the connection closes)
  cut_request     only the streamed chat request of this index (0-based, in arrival order) is cut so, after
                  2 token chunks: one lost request among good ones
  hang_after      after this many token chunks no token comes again, only SSE keep-alive comments
                  (`: ping`) every `ping` seconds
  usage           False: streams carry no usage (the client must refuse to guess)
  ttft, step      seconds before the first chunk, between chunks (scheduled on absolute times)
  tokens          completion tokens per stream (max_tokens when the request sets it)
  spec            per-request increments of the counters: drafts, draft tokens, accepted, per position
  noisy, noise    the first `noisy` requests add `noise` instead (warm-up must not count)
  total_suffix    False: the counters are exported without `_total` (as some exporters do)
  on_completion   called after each completion is sent
  tool_mode, needle_fail_from, max_model_len   non-streamed chat answers and /tokenize (standin_chat.py)
  records, bodies what each request got (server clock) and what it sent

As vLLM (the entrypoint of the launcher `write_fake_vllm` writes): `python standin.py --model M
--host H --port P [--served-model-name N] [--api-key K] [vLLM's other flags, ignored] --standin-*`:
  --standin-mode good | exit0 | exit1 (a traceback-ish line) | nobind (alive, never listens) |
      health503 | fatal-hang (a worker's fatal line, then alive and never listening, as vLLM 0.26's
      API server after a tensor-parallel worker died) | die-after-ready (exit 3 one second after
      the first completion) | wrong-root (/v1/models lists another root)
  --standin-pidfile F   writes "server_pid helper_pid": it starts a helper child, as vLLM starts its
                        engine core, so tests can check the whole group is gone
  --standin-envfile F   writes its environment as JSON
  --standin-stubborn-helper  the helper ignores SIGTERM and is left behind on exit (a wedged engine)
  --standin-answers F   the answers table as JSON
  --standin-no-total    the counters without `_total`
  --standin-kernel K    logs "Using K for CompressedTensorsWNA16" as vLLM does per linear kernel it picks
  --standin-ballast-file F  refuse to start (exit 1) unless F holds the report of a live ballast (the
                        stand-in ballast of QWENQUANT_BALLAST_STANDIN=F), and on SIGTERM write to
                        F.at-server-stop whether that ballast still lives
Setup: `build_standin_artifact` (an artifact of zero int4 weights with a real manifest),
`write_fake_vllm` (a launcher whose entrypoint is this file, with a stub `vllm` package so serve's
discovery and architecture probe run for real), `serve_env`.
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
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from standin_chat import chat_answer, words

PROMPT_TOKENS = 120
START = (100.0, 300.0, 50.0, (30.0, 15.0, 5.0))  # nonzero at start: only deltas may be used
# per request: 4 drafts of 3 tokens, 6 accepted (position 0: 3, position 1: 2, position 2: 1)
STEP = (4.0, 12.0, 6.0, (3.0, 2.0, 1.0))


@dataclass
class Record:
    """Server-side clock of one request (perf_counter, the same monotonic clock as the client's)."""

    recv: float
    first: float | None = None
    done: float | None = None
    tokens: int = 0


@dataclass
class Counters:
    drafts: float = START[0]
    draft_tokens: float = START[1]
    accepted: float = START[2]
    per_pos: list[float] = field(default_factory=lambda: list(START[3]))


class StandinServer:
    """Start with `with StandinServer() as s:`; s.url; switches as attributes (see the module docstring)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, verbose: bool = False) -> None:
        self.model = "standin"
        self.root: str | None = "/x"
        self.api_key: str | None = None
        self.health = 200
        self.answers: dict[str, str] = {}
        self.field = "content"
        self.hidden = 0
        self.reasoning_details = False
        self.usage_delta = 0
        self.cut_after: int | None = None
        self.cut_request: int | None = None
        self.hang_after: int | None = None
        self.ping = 0.05
        self.usage = True
        self.ttft = 0.05
        self.step = 0.02
        self.tokens = 40
        self.spec: tuple[float, float, float, Any] = STEP
        self.noisy = 0
        self.noise: tuple[float, float, float, Any] = (1.0, 3.0, 3.0, (1.0, 1.0, 1.0))
        self.total_suffix = True
        self.on_completion: Callable[[], None] | None = None
        self.tool_mode = "answer"
        self.needle_fail_from: int | None = None
        self.max_model_len = 4096
        self.verbose = verbose
        self.records: list[Record] = []
        self.bodies: list[dict[str, Any]] = []
        self.counters = Counters()
        self.lock = threading.Lock()
        self._requests = 0
        self.httpd = ThreadingHTTPServer((host, port), _handler(self))
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> StandinServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def count(self) -> None:
        """One request's speculative-decoding counters."""
        with self.lock:
            self._requests += 1
            d, dt, a, pos = self.spec if self._requests > self.noisy else self.noise
            c = self.counters
            c.drafts, c.draft_tokens, c.accepted = c.drafts + d, c.draft_tokens + dt, c.accepted + a
            c.per_pos = [x + y for x, y in zip(c.per_pos, pos, strict=False)]

    def metrics_text(self) -> str:
        c, sfx = self.counters, "_total" if self.total_suffix else ""
        labels = 'engine="0",model_name="stand\\"in"'
        lines = [
            f"# HELP vllm:spec_decode_num_drafts{sfx} Number of spec decoding drafts.",
            f"# TYPE vllm:spec_decode_num_drafts{sfx} counter",
            f"vllm:spec_decode_num_drafts{sfx}{{{labels}}} {c.drafts}",
            f"vllm:spec_decode_num_drafts_created{{{labels}}} 1.7e9",
            f"vllm:spec_decode_num_draft_tokens{sfx}{{{labels}}} {c.draft_tokens}",
            f"vllm:spec_decode_num_accepted_tokens{sfx}{{{labels}}} {c.accepted}",
            'vllm:num_requests_running{engine="0"} 0.0',
        ]
        lines += [
            f'vllm:spec_decode_num_accepted_tokens_per_pos{sfx}{{{labels},position="{i}"}} {v}'
            for i, v in enumerate(c.per_pos)
        ]
        return "\n".join(lines) + "\n"


class _Handler(BaseHTTPRequestHandler):
    s: StandinServer  # set by _handler()
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt: str, *args: Any) -> None:
        if self.s.verbose:
            print("standin http: " + fmt % args, flush=True)

    def _send(self, code: int, obj: Any, ctype: str = "application/json") -> None:
        body = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _authorized(self) -> bool:
        if self.s.api_key and self.headers.get("Authorization") != f"Bearer {self.s.api_key}":
            self._send(401, {"error": "Unauthorized"})
            return False
        return True

    def do_GET(self) -> None:
        if self.path == "/health":
            self._send(self.s.health, {})
        elif self.path == "/version":
            self._send(200, {"version": "0.0.0-standin"})
        elif self.path == "/metrics":
            self._send(200, self.s.metrics_text().encode(), "text/plain; version=0.0.4")
        elif self.path == "/v1/models":
            if self._authorized():
                self._send(
                    200,
                    {
                        "object": "list",
                        "data": [
                            {
                                "id": self.s.model,
                                "object": "model",
                                "root": self.s.root,
                                "owned_by": "vllm",
                                "max_model_len": self.s.max_model_len,
                            }
                        ],
                    },
                )
        else:
            self._send(404, {"error": "not found"})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        if self.path == "/tokenize":
            self._send(200, {"count": words(body), "max_model_len": self.s.max_model_len, "tokens": []})
            return
        if self.path not in ("/v1/completions", "/v1/chat/completions"):
            self._send(404, {"error": "not found"})
            return
        if not self._authorized():
            return
        with self.s.lock:
            self.s.bodies.append(body)
        if self.path == "/v1/chat/completions" and not body.get("stream"):
            self._send(200, chat_answer(self.s, body))
            return
        if self.path == "/v1/chat/completions":
            rec = Record(recv=time.perf_counter())
            with self.s.lock:
                self.s.records.append(rec)
                cut = 2 if len(self.s.records) - 1 == self.s.cut_request else self.s.cut_after
            self.s.count()
            self._stream(body, rec, cut)
            return
        if body.get("model") != self.s.model:
            self._send(404, {"error": f"model {body.get('model')} not found"})
            return
        self.s.count()
        text = self.s.answers.get(body.get("prompt"), " world")
        self._send(
            200,
            {
                "id": "cmpl-standin",
                "object": "text_completion",
                "model": self.s.model,
                "choices": [{"index": 0, "text": text, "finish_reason": "length"}],
            },
        )
        if self.s.on_completion:
            self.s.on_completion()

    def _event(self, obj: Any) -> None:
        data = (f"data: {obj}\n\n" if isinstance(obj, str) else f"data: {json.dumps(obj)}\n\n").encode()
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _keepalive(self, limit: float = 30.0) -> None:
        """SSE comments and no token, until the client goes away (or `limit` seconds pass)."""
        end = time.perf_counter() + limit
        while time.perf_counter() < end:
            time.sleep(self.s.ping)
            try:
                data = b": ping\n\n"
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()
            except OSError:
                return
        self.close_connection = True

    def _stream(self, body: dict[str, Any], rec: Record, cut_after: int | None = None) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        n = int(body.get("max_tokens") or self.s.tokens)
        base = {"id": "x", "object": "chat.completion.chunk", "model": self.s.model}
        self._event({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}], "usage": None})
        for i in range(n):
            if i == cut_after:
                self.close_connection = True
                return
            if i == self.s.hang_after:
                self._keepalive()
                return
            time.sleep(max(0.0, rec.recv + self.s.ttft + i * self.s.step - time.perf_counter()))
            # a hidden phase still sends chunks, with no text in any field
            delta = {} if i < self.s.hidden else {self.s.field: f"w{i} "}
            self._event({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
            if delta and rec.first is None:
                rec.first = time.perf_counter()
        self._event({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
        if self.s.usage:
            usage: dict[str, Any] = {
                "prompt_tokens": PROMPT_TOKENS,
                "completion_tokens": n + self.s.usage_delta,
                "total_tokens": n + self.s.usage_delta + PROMPT_TOKENS,
            }
            if self.s.reasoning_details:
                usage["completion_tokens_details"] = {"reasoning_tokens": self.s.hidden}
            self._event({**base, "choices": [], "usage": usage})
        self._event("[DONE]")
        rec.done, rec.tokens = time.perf_counter(), n
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


def _handler(s: StandinServer) -> type[BaseHTTPRequestHandler]:
    return type("Handler", (_Handler,), {"s": s})


# --- as vLLM: the process `qwenquant serve` starts -------------------------------------------------


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
    p.add_argument("--standin-no-total", action="store_true")
    p.add_argument("--standin-ballast-file", default=None)
    p.add_argument("--standin-kernel", action="append", default=[])
    args, _unknown = p.parse_known_args(argv)
    return args


def _helper(a: argparse.Namespace) -> subprocess.Popen:
    code = "import time; time.sleep(600)"
    if a.standin_stubborn_helper:
        code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
    helper = subprocess.Popen([sys.executable, "-c", code])
    if a.standin_pidfile:
        Path(a.standin_pidfile).write_text(f"{os.getpid()} {helper.pid}\n")
    return helper


def alive(pid: int) -> bool:
    """`pid` runs (a zombie does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def _ballast_pid(path: str | None) -> int | None:
    """The pid of the live ballast whose report is in `path`, else None."""
    try:
        pid = int(json.loads(Path(path).read_text())["pid"]) if path else None
    except (OSError, ValueError, KeyError):
        return None
    return pid if pid is not None and alive(pid) else None


def _on_sigterm(a: argparse.Namespace, helper: subprocess.Popen) -> None:
    def stop(*_: object) -> None:
        if a.standin_ballast_file:
            Path(a.standin_ballast_file + ".at-server-stop").write_text(
                json.dumps({"ballast_alive": _ballast_pid(a.standin_ballast_file) is not None})
            )
        if not a.standin_stubborn_helper:
            helper.kill()
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)


def main(argv: list[str]) -> int:
    a = parse(argv)
    mode = a.standin_mode
    print(f"standin: mode={mode} model={a.model} port={a.port} argv={argv}", flush=True)
    if a.standin_ballast_file:
        pid = _ballast_pid(a.standin_ballast_file)
        if pid is None:
            print("RuntimeError: standin started with no ballast holding the GPU", flush=True)
            return 1
        print(f"standin: ballast pid {pid} holds the GPU", flush=True)
    if a.standin_envfile:
        Path(a.standin_envfile).write_text(json.dumps(dict(os.environ)))
    for kernel in a.standin_kernel:  # the line vLLM's compressed_tensors_wNa16.py logs per kernel it chose
        print(
            f"(EngineCore pid=9) INFO 12-06 19:00:00 [compressed_tensors_wNa16.py:138] Using {kernel} for "
            "CompressedTensorsWNA16",
            flush=True,
        )
    helper = _helper(a)
    if mode in ("exit0", "exit1"):
        print(
            "standin: nothing to do, exiting 0"
            if mode == "exit0"
            else "RuntimeError: standin failed to load the model",
            flush=True,
        )
        helper.kill()
        return 0 if mode == "exit0" else 1
    _on_sigterm(a, helper)
    if mode == "fatal-hang":
        print("(Worker_TP1 pid=7) ERROR [multiproc_executor.py:1007] WorkerProc hit an exception.", flush=True)
    if mode in ("nobind", "fatal-hang"):
        while True:
            time.sleep(1)
    s = StandinServer(a.host, a.port, verbose=True)
    s.model = a.served_model_name or a.model
    s.root = "/somewhere/else" if mode == "wrong-root" else a.model
    s.api_key, s.total_suffix = a.api_key, not a.standin_no_total
    s.health = 503 if mode == "health503" else 200
    s.answers = json.loads(Path(a.standin_answers).read_text()) if a.standin_answers else {}
    if mode == "die-after-ready":
        s.on_completion = lambda: threading.Timer(
            1.0, lambda: (print("standin: dying", flush=True), helper.kill(), os._exit(3))
        ).start()
    print(f"standin: listening on {a.host}:{a.port}", flush=True)
    s.httpd.serve_forever()
    return 0


# --- the serving setup: an artifact and a launcher for `qwenquant serve` ---------------------------

ARCHS = ["Qwen3_5ForConditionalGeneration", "Qwen3_5ForCausalLM"]
W4 = {
    "num_bits": 4,
    "type": "int",
    "symmetric": True,
    "strategy": "group",
    "group_size": 128,
    "dynamic": False,
    "actorder": None,
    "observer": "minmax",
}


def _is_packed_linear(name: str) -> bool:
    if "visual" in name or name.startswith("mtp.") or "in_proj_a" in name or "in_proj_b" in name:
        return False
    leaf = name.rsplit(".", 2)[-2] if name.endswith(".weight") else ""
    return leaf.endswith("_proj") or leaf in ("in_proj_qkv", "in_proj_z") or name == "lm_head.weight"


def build_standin_artifact(tiny: Path, out: Path) -> Path:
    """The tiny checkpoint as a pack-quantized multimodal-layout artifact (zeros) with a manifest."""
    import torch
    from safetensors.torch import load_file, save_file

    from qwenquant.recipe import load_recipe

    from helpers import write_test_manifest

    out.mkdir(parents=True)
    tensors: dict[str, torch.Tensor] = {}
    for f in sorted(tiny.glob("*.safetensors")):
        for name, t in load_file(f).items():
            if _is_packed_linear(name):
                rows, cols = t.shape
                mod = name[: -len(".weight")]
                tensors[mod + ".weight_packed"] = torch.zeros(rows, cols // 8, dtype=torch.int32)
                tensors[mod + ".weight_scale"] = torch.ones(rows, cols // 128, dtype=torch.bfloat16)
                tensors[mod + ".weight_shape"] = torch.tensor([rows, cols], dtype=torch.int64)
            else:
                tensors[name] = t
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((tiny / "config.json").read_text())
    group = {"weights": W4, "input_activations": None, "output_activations": None, "format": "pack-quantized"}
    config["quantization_config"] = {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "config_groups": {
            "group_0": {**group, "targets": ["Linear"]},
            "group_1": {**group, "targets": ["re:.*lm_head$"]},
        },
        "ignore": ["re:.*visual.*", "re:^mtp.*", "re:.*linear_attn.in_proj_a$", "re:.*linear_attn.in_proj_b$"],
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))
    for name in (
        "generation_config.json",
        "preprocessor_config.json",
        "video_preprocessor_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ):
        if (tiny / name).exists():
            (out / name).write_bytes((tiny / name).read_bytes())
    recipe = load_recipe("w4a16-int4head").canonical()
    recipe["artifact"]["layout"] = "multimodal"
    write_test_manifest(out, recipe)
    return out


def write_fake_vllm(root: Path, version: str = "0.33.0", avx512: bool = True) -> Path:
    """A launcher json whose entrypoint is this stand-in, and an importable stub `vllm` package
    (version, CPU platform, registry) and W4A16 plugin, so discovery and the probes run for real.
    `version`: the vLLM version it claims; `avx512`: False answers as vLLM's CPU build on a CPU without
    AVX-512 or AMX (the plugin's dense fallback, no fp8 KV cache)."""
    pkg = root / "site" / "vllm"
    (pkg / "platforms").mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        f"__version__ = {version!r}\nclass ModelRegistry:\n    @staticmethod\n"
        f"    def get_supported_archs():\n        return {ARCHS!r}\n"
    )
    (pkg / "platforms" / "__init__.py").write_text("class _P:\n    device_type = 'cpu'\ncurrent_platform = _P()\n")
    # what scripts/install-vllm.sh adds to a CPU build: the W4A16 plugin, answering as on a CPU with (or without)
    # AVX-512, with the keys scripts/vllm-cpu/plugin's describe() returns
    plugin = root / "site" / "qwenquant_vllm_cpu"
    plugin.mkdir()
    (plugin / "__init__.py").write_text(
        "import os\n"
        f"AVX512 = {avx512!r}\n"
        "def describe():\n"
        "    dense = os.environ.get('QWENQUANT_VLLM_CPU_W4A16') == 'dense' or not AVX512\n"
        "    why = 'stand-in vLLM' if AVX512 else 'stand-in vLLM (this CPU has no AVX-512) registers no cpu_gemm_wna16'\n"
        "    return {'path': 'dense' if dense else 'kernel', 'why': why, 'has_op': AVX512, 'plugin': True,\n"
        "            'cpu_avx512': AVX512, 'cpu_amx': False, 'fp8_kv_cache': AVX512}\n"
    )
    launcher = root / "qwenquant-vllm.json"
    launcher.write_text(
        json.dumps(
            {
                "python": sys.executable,
                "entrypoint": [sys.executable, str(Path(__file__))],
                "vllm_version": version,
                "device": "cpu",
            }
        )
    )
    return launcher


def serve_env(launcher: Path, tmp_path: Path) -> dict[str, str]:
    """The environment for `qwenquant serve` with the stand-in launcher (its stub vllm importable)."""
    env = dict(os.environ)
    # the stub vllm first; then whatever put this checkout's qwenquant on the path
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(launcher.parent / "site"), env.get("PYTHONPATH")) if p)
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    env["QWENQUANT_NO_PROGRESS"] = "1"
    env.pop("QWENQUANT_VLLM", None)
    return env


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
