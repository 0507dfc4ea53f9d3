"""`qwenquant eval served --serve` with the real vLLM (CPU build from .venv-vllm) serving the quantized tiny
reference with MTP: the server starts through serve's machinery, the shipped gate passes, the
trained MTP head is accepted at a real rate read from vLLM's own /metrics counters, and the server
is stopped. One server for the module (the gate code is the one `eval served URL` runs; the
stand-in tests cover that path and the failure paths)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import LAUNCHER, require_vllm, vllm_env

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]


def _env(tmp: Path) -> dict[str, str]:
    return dict(vllm_env(tmp), QWENQUANT_THREADS="2")


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory, reference_w4a16: Path) -> Path:
    require_vllm(LAUNCHER, ".venv-vllm")
    tmp = tmp_path_factory.mktemp("evalvllm")
    art = Path(shutil.copytree(reference_w4a16, tmp / "artifact"))
    return art


def test_serve_runs_the_gate_with_real_mtp_acceptance_and_stops(artifact: Path) -> None:
    """One real server for the module: `eval served --serve` starts it through serve's machinery and stops it."""
    from qwenquant.evaluate.report import report_path, served_kind
    from qwenquant.manifest import load_manifest

    tmp = artifact.parent
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "qwenquant",
            "eval",
            "served",
            "--serve",
            str(artifact),
            "--profile",
            "single-user",
            "--vllm",
            str(LAUNCHER),
            "--min-acceptance-length",
            "1.2",
            "--json",
            "--",
            "--max-model-len",
            "2048",
        ],
        env=_env(tmp),
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    digest = load_manifest(artifact).root_digest
    assert out["root_digest"] == digest
    config = {k: out["served"][k] for k in ("activations", "profile", "extra_vllm_flags")}
    assert report_path(artifact, digest, served_kind(**config)).is_file()  # named by its configuration
    assert all(t["passed"] >= t["min_pass"] for t in out["tasks"])
    m = out["mtp"]
    assert m["drafts"] > 0 and m["mean_acceptance_length"] > 1.2
    assert set(m["per_position"]) == {"0", "1", "2"}  # the single-user profile drafts 3 tokens
    rates = [m["per_position"][p] for p in ("0", "1", "2")]
    assert rates == sorted(rates, reverse=True)  # a later draft is accepted only after the earlier ones
    assert "stopping the server" in proc.stderr
    port = int(out["url"].rsplit(":", 1)[1])
    with pytest.raises(ConnectionRefusedError):  # the server is gone: nothing listens on its port
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
