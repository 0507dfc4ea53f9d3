"""The ballast's size arithmetic and command (pure); its lifecycle under `qwenquant serve` is in
tests/integration/test_serve_ballast.py (with a stand-in: no GPU here); pytest needs the two basenames distinct."""

from __future__ import annotations

import sys

import pytest

from qwenquant.serve import ballast
from qwenquant.serve.ballast import CHUNK, PAGE, BallastError, ballast_command, next_chunk, planned_hold

MiB = 1024**2
GiB = 1024**3


def _fill(free: int, size: int) -> tuple[list[int], int]:
    """The chunks the ballast's loop allocates on an allocator that takes exactly what is asked."""
    chunks = []
    while (n := next_chunk(free, size)) > 0:
        chunks.append(n)
        free -= n
    return chunks, free


def test_an_h200_filled_down_to_24_gib():
    free = 143210 * MiB - 512 * MiB  # nvidia-smi's free minus the ballast's own context
    chunks, left = _fill(free, 24 * GiB)
    assert left == 24 * GiB + (free - 24 * GiB) % PAGE and 0 <= left - 24 * GiB < PAGE
    assert all(c <= CHUNK and c % PAGE == 0 for c in chunks)
    assert sum(chunks) == planned_hold(free, 24 * GiB) == (free - 24 * GiB) // PAGE * PAGE
    assert len(chunks) == -(-(free - 24 * GiB) // CHUNK)


def test_within_a_page_nothing_more_is_taken():
    assert next_chunk(24 * GiB + PAGE - 1, 24 * GiB) == 0
    assert next_chunk(24 * GiB + PAGE, 24 * GiB) == PAGE
    assert next_chunk(24 * GiB + 3 * PAGE + 5, 24 * GiB, chunk=2 * PAGE) == 2 * PAGE
    assert next_chunk(20 * GiB, 24 * GiB) == 0  # never negative


def test_less_free_than_the_card_is_an_error():
    assert planned_hold(24 * GiB, 24 * GiB) == 0
    with pytest.raises(BallastError, match="20.00 GiB free, less than the 24.00 GiB to leave"):
        planned_hold(20 * GiB, 24 * GiB)


def test_command_runs_isolated_with_the_figures_it_needs():
    argv = ballast_command(sys.executable, 24 * GiB, 2, [100 * GiB, 99 * GiB])
    assert argv[:3] == [sys.executable, "-I", ballast.__file__]
    assert argv[3:] == ["--size", str(24 * GiB), "--devices", "2", "--free-before", f"{100 * GiB},{99 * GiB}"]
    assert ballast._args(argv[3:]) == {
        "size": 24 * GiB,
        "devices": 2,
        "free_before": [100 * GiB, 99 * GiB],
        "probe": False,
    }
    with pytest.raises(ValueError, match="unknown argument"):
        ballast._args(["--sizes", "1"])
