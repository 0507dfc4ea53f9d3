"""`qwenquant eval served --serve ARTIFACT --spec-check` with the real vLLM (CPU build from .venv-vllm) and the
quantized tiny reference: eval starts the server with the profile's MTP (3 drafts), reads k from its /metrics,
sends token-id prompts of k, 1 + k, 2 + k, 2k + 1, 16, 64 and 256 tokens greedily, stops it, starts the same
artifact with `--speculative-config null`, sends the same prompts, and compares token by token (vllm #53051: a
1 + k prompt came back garbage with MTP). One CLI run for the module: it starts both servers, one at a time."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import LAUNCHER, require_vllm, vllm_env

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def _env(tmp: Path) -> dict[str, str]:
    return dict(vllm_env(tmp), QWENQUANT_THREADS="2")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, reference_w4a16: Path) -> tuple[subprocess.CompletedProcess, dict]:
    require_vllm(LAUNCHER, ".venv-vllm")
    tmp = tmp_path_factory.mktemp("specvllm")
    art = Path(shutil.copytree(reference_w4a16, tmp / "artifact"))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "qwenquant",
            "eval",
            "served",
            "--serve",
            str(art),
            "--profile",
            "single-user",
            "--vllm",
            str(LAUNCHER),
            "--spec-check",
            "--json",
            "--",
            "--max-model-len",
            "2048",
        ],
        env=_env(tmp),
        capture_output=True,
        text=True,
        timeout=1500,
    )
    return proc, (json.loads(proc.stdout) if proc.stdout.strip() else {})


def test_greedy_text_with_mtp_agrees_with_greedy_text_without_it(run) -> None:
    """Measured here (evaluate/speccheck.py): most prompts agree to the last token; a divergence was only ever a tie
    0.031 nats apart, which the server without speculation confirms at that point."""
    proc, out = run
    assert proc.returncode == 0, proc.stderr[-3000:]
    spec = out["spec_check"]
    assert spec["draft_tokens"] == 3 and spec["ok"] and spec["changed"] == 0
    assert [p["prompt_tokens"] for p in spec["prompts"]] == [3, 4, 5, 7, 16, 64, 256]
    assert [p["prompt_tokens"] for p in spec["prompts"] if p["one_plus_k"]] == [4]
    assert all(p["generated"] == 48 for p in spec["prompts"])
    assert all(p["tie"] and p["tie_gap"] <= 0.1 for p in spec["prompts"] if p["first_divergence"] is not None)
    err = " ".join(proc.stderr.split())
    assert "without speculation at http" in err and "speculation check (k = 3): " in err
    assert "0 changed beyond a 0.1-nat tie" in err


def test_the_drafting_server_drafted_while_the_reference_did_not(run) -> None:
    """The check compared what it claims: the gate's server drafted (acceptance counted), and the server for the
    reference passed eval's test that it does not draft (else the run exits 8 naming it)."""
    proc, out = run
    assert out["mtp"]["drafts"] > 0
    assert out["served"]["profile"] == "single-user"
