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
