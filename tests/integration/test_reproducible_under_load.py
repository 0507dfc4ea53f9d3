"""The same inputs give the same bytes however busy the machine: the demo's model (the trained tiny
reference) quantized several times through the real CLI, each build with a busy process beside it (a
Python busy loop in a subprocess: other work on the CPU, as a shared machine has), gives one root
digest, and the same one as a build on an otherwise quiet run of this test. The thread count is held
(QWENQUANT_THREADS=2, as `qq` sets it): it is one of the inputs that must match (README). The busy
builds run with OMP_DYNAMIC=true, with which the OpenMP runtime may give a parallel region fewer
threads than asked, by the load on the machine: the count asked for must stay the count used (quantize
turns dynamic teams off), else the load changes the bytes.

MKL (the Hessians' Cholesky factors, float32 matmuls) promises the same bytes run to run only in its
conditional numerical reproducibility mode: the quiet build, with MKL_CBWR unset, runs with MKL_VERBOSE
on, and every MKL call it makes must say `CNR:AUTO`.

To stay affordable the recipe is w4a16-int4head with the tiny-reference calibration set: every stage
that computes (gptq with the full-attention layer 3, lm_head) and no eval stage."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from helpers import qq

pytestmark = pytest.mark.slow

BUSY_BUILDS = 2  # with the quiet build: three builds in all


@contextmanager
def _busy_cpu() -> Iterator[None]:
    """One process spinning on a CPU for the duration of the block."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        proc.kill()
        proc.wait()


def _build(source: Path, out: Path) -> tuple[str, str]:
    """The build's root digest (from its manifest) and what it printed on stdout."""
    argv = ["quantize", str(source), "--recipe", "w4a16-int4head", "--calibration", "tiny-reference"]
    proc = qq(*argv, "--source-unverified", "--device", "cpu", "--out", str(out), timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "qwenquant-manifest.json").read_text())["root_digest"], proc.stdout


def test_builds_with_a_busy_process_beside_them_give_one_root_digest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    from qwenquant.testbed.tiny import reference_model

    source = reference_model.build_reference_checkpoint(tmp_path / "source")
    monkeypatch.delenv("MKL_CBWR", raising=False)  # quantize's own choice of MKL's mode
    monkeypatch.setenv("MKL_VERBOSE", "1")  # each MKL call printed with its mode
    digest, printed = _build(source, tmp_path / "quiet")
    monkeypatch.delenv("MKL_VERBOSE")
    if torch.backends.mkl.is_available():
        calls = [ln for ln in printed.splitlines() if ln.startswith("MKL_VERBOSE ") and " CNR:" in ln]
        assert len(calls) > 100, printed[-2000:]  # the Hessians, Cholesky factors and float32 matmuls
        assert {ln.split(" CNR:")[1].split()[0] for ln in calls} == {"AUTO"}
    manifest = json.loads((tmp_path / "quiet" / "qwenquant-manifest.json").read_text())
    assert manifest["stages"]["gptq"]["inputs"]["mkl_cbwr"] == "AUTO"  # the mode is an input, recorded
    digests = [digest]
    monkeypatch.setenv("OMP_DYNAMIC", "true")  # the runtime may size teams by the load average
    for i in range(BUSY_BUILDS):
        with _busy_cpu():
            digests.append(_build(source, tmp_path / f"busy-{i}")[0])
    assert len(Counter(digests)) == 1, f"root digests (quiet build first): {digests}"
