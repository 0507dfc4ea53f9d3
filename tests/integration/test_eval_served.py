"""`qwenquant eval --served` against a stand-in server.

STAND-IN: the server below is not vLLM. It answers /v1/models, /v1/completions (from a fixed
prompt -> text table) and a Prometheus /metrics page whose speculative-decoding counters start
at non-zero values and grow by set amounts per completion, so the expected acceptance figures are
known exactly. A real vLLM cannot be made to accept a chosen number of drafts; the real-vLLM run of
the gate is in test_eval_vllm.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ANSWERS = {"import o": "s\nimport sys", "def f(sel": "f, x):", "while Tr": "ue:\n"}
GATE = {"name": "standin", "tasks": [
    {"name": "imports", "cases": [{"prompt": "import o", "expect": "s\nimport"}]},
    {"name": "defs", "cases": [{"prompt": "def f(sel", "expect": "f,"}, {"prompt": "while Tr", "expect": "ue:"}]},
    ],
    "acceptance_runs": [{"prompt": "import o", "max_tokens": 8}],
}
# Per completion: 4 drafts of 3 tokens; 6 accepted (position 0: 3, position 1: 2, position 2: 1).
START = {"drafts": 100.0, "tokens": 300.0, "accepted": 50.0, "pos": [30.0, 15.0, 5.0]}
STEP = {"drafts": 4.0, "tokens": 12.0, "accepted": 6.0, "pos": [3.0, 2.0, 1.0]}


class _State:
    def __init__(self, answers: dict[str, str], with_drafts: bool) -> None:
        self.answers, self.with_drafts, self.completions = answers, with_drafts, 0

    def metrics(self) -> str:
        n = self.completions if self.with_drafts else 0
        v = {k: START[k] + n * STEP[k] for k in ("drafts", "tokens", "accepted")}
        lines = ["# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.",
                 "# TYPE vllm:spec_decode_num_drafts_total counter",
                 f'vllm:spec_decode_num_drafts_total{{engine="0",model_name="m"}} {v["drafts"]}',
                 f'vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="m"}} {v["tokens"]}',
                 f'vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="m"}} {v["accepted"]}',
                 'vllm:num_requests_running{engine="0",model_name="m"} 0.0']
        for p in range(3):
            lines.append(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="{p}"}} '
                         f'{START["pos"][p] + n * STEP["pos"][p]}')
        return "\n".join(lines) + "\n"


def _handler(state: _State) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _send(self, body: bytes, ctype: str = "application/json") -> None:
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/v1/models":
                self._send(json.dumps({"data": [{"id": "standin-model"}]}).encode())
            elif self.path == "/metrics":
                self._send(state.metrics().encode(), "text/plain")
            else:
                self.send_error(404)

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            assert body["model"] == "standin-model" and body["temperature"] == 0.0
            state.completions += 1
            text = state.answers.get(body["prompt"], "???")
            self._send(json.dumps({"choices": [{"text": text, "index": 0}]}).encode())

    return Handler


@pytest.fixture
def server():
    servers = []

    def start(answers: dict[str, str] = ANSWERS, with_drafts: bool = True) -> str:
        srv = ThreadingHTTPServer(("127.0.0.1", 0), _handler(_State(answers, with_drafts)))
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}"

    yield start
    for srv in servers:
        srv.shutdown()


def _eval(url: str, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    gate = tmp_path / "gate.json"
    gate.write_text(json.dumps(GATE))
    return subprocess.run([sys.executable, "-m", "qwenquant", "eval", "--served", url, "--gate", str(gate), "--json", *extra],
                          capture_output=True, text=True, timeout=120, cwd=REPO, env=dict(os.environ))


def test_gate_passes_and_acceptance_comes_from_counter_deltas(server, tmp_path: Path) -> None:
    proc = _eval(server(), tmp_path, "--min-acceptance-length", "2.4", "--report", str(tmp_path / "r.json"))
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert [(t["name"], t["passed"], t["total"]) for t in out["tasks"]] == [("imports", 1, 1), ("defs", 2, 2)]
    m = out["mtp"]
    # 3 gate completions + 1 acceptance run: 16 drafts, 48 draft tokens, 24 accepted -> 1 + 24/16 = 2.5
    # (not the absolute counters' 1 + 74/116)
    assert (m["drafts"], m["draft_tokens"], m["accepted_tokens"]) == (16, 48, 24)
    assert m["mean_acceptance_length"] == pytest.approx(2.5)
    assert m["per_position"] == pytest.approx({"0": 0.75, "1": 0.5, "2": 0.25})
    assert "mean acceptance length 2.500" in proc.stderr and "task defs: 2/2 passed" in proc.stderr
    assert json.loads((tmp_path / "r.json").read_text())["ok"] is True


def test_low_acceptance_fails_the_command(server, tmp_path: Path) -> None:
    proc = _eval(server(), tmp_path, "--min-acceptance-length", "2.6")
    assert proc.returncode != 0
    assert "MTP mean acceptance length 2.500 is below 2.6" in proc.stderr
    assert json.loads(proc.stdout)["ok"] is False


def test_a_wrong_answer_fails_its_task(server, tmp_path: Path) -> None:
    proc = _eval(server({**ANSWERS, "while Tr": "y:\n"}), tmp_path)
    assert proc.returncode != 0
    assert "task defs: 1/2 passed, needs 2" in proc.stderr
    fail = json.loads(proc.stdout)["tasks"][1]["failures"]
    assert fail == [{"prompt": "while Tr", "expect": "ue:", "got": "y:\n"}]


def test_no_drafts_fails_when_acceptance_is_required(server, tmp_path: Path) -> None:
    url = server(with_drafts=False)
    assert _eval(url, tmp_path).returncode == 0  # no threshold asked: the gate alone decides
    proc = _eval(url, tmp_path, "--min-acceptance-length", "1.1")
    assert proc.returncode != 0
    assert "reported no speculative drafts" in proc.stderr
