"""The lm_head row chunk sized from the GPU budget (quantize/head_memory.py)."""

from __future__ import annotations

import pytest

from qwenquant.quantize.head_memory import (
    CPU_ROW_CHUNK,
    ROW_CHUNK_CAP,
    budget_bytes,
    gptq_fixed_bytes,
    gptq_row_bytes,
    resolve_row_chunk,
    row_chunk_for_budget,
)

V, D = 248320, 5120  # the 27B head
GIB = 1 << 30


def working_set(rows: int) -> int:
    return gptq_fixed_bytes(D) + rows * gptq_row_bytes(D, 128, 128)


def test_an_explicit_row_chunk_wins_over_any_budget() -> None:
    assert resolve_row_chunk(4096, V, D, 100 * GIB) == 4096
    assert resolve_row_chunk(4096, V, D, None) == 4096
    assert resolve_row_chunk(100_000, 1000, D, None) == 1000  # never more than the vocabulary


def test_auto_on_the_cpu_is_the_fixed_chunk_or_the_whole_vocabulary() -> None:
    assert resolve_row_chunk("auto", V, D, None) == CPU_ROW_CHUNK
    assert resolve_row_chunk("auto", 1024, 64, None) == 1024


def test_auto_on_a_big_gpu_is_capped() -> None:
    assert resolve_row_chunk("auto", V, D, budget_bytes(130 * GIB, 0, None)) == ROW_CHUNK_CAP == 32768
    assert resolve_row_chunk("auto", 20000, D, 130 * GIB) == 20000  # and at the vocabulary


@pytest.mark.parametrize("budget_gib", [0.5, 1.0, 1.7, 2.0])
def test_auto_picks_the_largest_aligned_chunk_that_fits(budget_gib: float) -> None:
    budget = int(budget_gib * GIB)
    n = resolve_row_chunk("auto", V, D, budget)
    assert n % 1024 == 0 and 1024 <= n < ROW_CHUNK_CAP
    assert working_set(n) <= budget < working_set(n + 1024)


def test_a_budget_smaller_than_the_fixed_part_still_runs_one_row_at_a_time() -> None:
    assert row_chunk_for_budget(V, D, 0) == 1
    assert row_chunk_for_budget(V, D, gptq_fixed_bytes(D) + 10 * gptq_row_bytes(D, 128, 128)) == 10


def test_the_count_covers_what_a_32768_row_chunk_was_measured_to_take() -> None:
    # benchmarks/lm_head_bench.py on an H200: peak 1.4 GiB of GPU memory at 32768 rows of the 27B head
    assert working_set(32768) >= 1.4 * GIB


def test_budget_is_free_plus_cache_under_the_cap_with_a_margin() -> None:
    assert budget_bytes(10 * GIB, 2 * GIB, None, safety=1.0) == 12 * GIB
    assert budget_bytes(10 * GIB, 2 * GIB, 4 * GIB, safety=1.0) == 4 * GIB  # QWENQUANT_MAX_GPU_MEM
    assert budget_bytes(10 * GIB, 0, -GIB) == 0  # already past the cap
    assert budget_bytes(10 * GIB, 0, None) == int(10 * GIB * 0.8)
