"""The same inputs give the same bytes however busy the machine: the demo's model (the trained tiny
reference) quantized several times through the real CLI, each build with a busy process beside it (a
Python busy loop in a subprocess: other work on the CPU, as a shared machine has), gives one root
digest, and the same one as a build on an otherwise quiet run of this test. The thread count is held
(QWENQUANT_THREADS=2, as `qq` sets it): it is one of the inputs that must match (README). The busy
builds run with OMP_DYNAMIC=true, with which the OpenMP runtime may give a parallel region fewer
threads than asked, by the load on the machine: the count asked for must stay the count used (quantize
turns dynamic teams off), else the load changes the bytes.

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


def _build(source: Path, out: Path) -> str:
    proc = qq(
        "quantize",
        str(source),
        "--recipe",
        "w4a16-int4head",
        "--calibration",
        "tiny-reference",
        "--source-unverified",
        "--device",
        "cpu",
        "--out",
        str(out),
        "--json",
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)["root_digest"]


def test_builds_with_a_busy_process_beside_them_give_one_root_digest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from qwenquant.testbed.tiny import reference_model

    source = reference_model.build_reference_checkpoint(tmp_path / "source")
    digests = [_build(source, tmp_path / "quiet")]
    monkeypatch.setenv("OMP_DYNAMIC", "true")  # the runtime may size teams by the load average
    for i in range(BUSY_BUILDS):
        with _busy_cpu():
            digests.append(_build(source, tmp_path / f"busy-{i}"))
    assert len(Counter(digests)) == 1, f"root digests (quiet build first): {digests}"


def test_quantize_runs_every_mkl_call_in_its_reproducible_mode(tmp_path: Path) -> None:
    """Outside its CNR mode MKL promises no run-to-run equality of a threaded call's bytes, even at a
    fixed thread count (oneMKL developer guide): every MKL call of a real `qwenquant quantize` runs
    with CNR on (MKL_VERBOSE prints each call's `CNR:` mode) where MKL_CBWR is unset, and the gptq
    stage records the mode among its inputs."""
    import os

    import torch

    from qwenquant.testbed.tiny import reference_model

    if not torch.backends.mkl.is_available():
        pytest.skip("torch here is built without MKL")
    source = reference_model.build_reference_checkpoint(tmp_path / "source")
    env = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"}
    env.update(MKL_VERBOSE="1", QWENQUANT_THREADS="2", QWENQUANT_NO_PROGRESS="1")
    argv = [sys.executable, "-m", "qwenquant", "quantize", str(source), "--recipe", "w4a16-int4head"]
    argv += ["--calibration", "tiny-reference", "--source-unverified", "--device", "cpu", "--out", str(tmp_path / "a")]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    calls = [ln for ln in proc.stdout.splitlines() if ln.startswith("MKL_VERBOSE ") and " CNR:" in ln]
    assert len(calls) > 100, proc.stdout[-2000:]  # the Hessians, Cholesky factors and float32 matmuls
    assert {ln.split(" CNR:")[1].split()[0] for ln in calls} == {"AUTO"}
    stages = json.loads((tmp_path / "a" / "qwenquant-manifest.json").read_text())["stages"]
    assert stages["gptq"]["inputs"]["mkl_cbwr"] == "AUTO"
