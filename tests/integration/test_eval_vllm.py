"""`qwenquant eval --served` against the real vLLM (CPU build from .venv-vllm) serving the quantized
tiny reference with MTP: the shipped gate passes and the trained MTP head is accepted at a real
rate, read from vLLM's own /metrics counters. One server for the module."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import LAUNCHER, require_vllm

from qwenquant.tiny import reference_model

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]


def _env(tmp: Path) -> dict[str, str]:
    env = dict(os.environ, QWENQUANT_NO_PROGRESS="1", QWENQUANT_THREADS="2", XDG_CACHE_HOME=str(tmp / "cache"),
               VLLM_CPU_KVCACHE_SPACE="1")
    env.pop("QWENQUANT_VLLM", None)
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    require_vllm(LAUNCHER, ".venv-vllm")
    tmp = tmp_path_factory.mktemp("evalvllm")
    src = reference_model.build_reference_checkpoint(tmp / "source")
    art = tmp / "artifact"
    q = subprocess.run([sys.executable, "-m", "qwenquant", "quantize", str(src), "--source-unverified", "--recipe",
                        "w4a16-int4head", "--calibration", "tiny-reference", "--out", str(art)],
                       env=_env(tmp), capture_output=True, text=True, timeout=1800)
    assert q.returncode == 0, q.stderr[-3000:]
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "qwenquant", "serve", str(art), "--profile", "single-user",
                             "--port", str(port), "--vllm", str(LAUNCHER), "--timeout", "900",
                             "--log-file", str(tmp / "server.log"), "--", "--max-model-len", "2048"],
                            env=_env(tmp), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if line.strip() != f"ready http://127.0.0.1:{port}":
        proc.kill()
        pytest.fail(f"not ready: {line!r}\n{proc.stderr.read()[-4000:]}")
    yield {"url": f"http://127.0.0.1:{port}", "tmp": tmp}
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=120)


def test_gate_passes_with_real_mtp_acceptance(served: dict) -> None:
    report = served["tmp"] / "served.json"
    proc = subprocess.run([sys.executable, "-m", "qwenquant", "eval", "--served", served["url"],
                           "--min-acceptance-length", "1.2", "--report", str(report), "--json"],
                          env=_env(served["tmp"]), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert all(t["passed"] >= t["min_pass"] for t in out["tasks"])
    m = out["mtp"]
    assert m["drafts"] > 0 and m["mean_acceptance_length"] > 1.2
    assert set(m["per_position"]) == {"0", "1", "2"}  # the single-user profile drafts 3 tokens
    rates = [m["per_position"][p] for p in ("0", "1", "2")]
    assert rates == sorted(rates, reverse=True)  # a later draft is accepted only after the earlier ones
