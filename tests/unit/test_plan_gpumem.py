"""`--gpu-mem`: the share of a real GPU that gives a smaller card's budget (pure)."""

from __future__ import annotations

import pytest

from qwenquant.errors import ServeError, UsageError
from qwenquant.plan.gpumem import apply_gpu_mem, emulate_card, utilization_for

GiB = 1024**3
MiB = 1024**2
H200 = 143771 * MiB  # what nvidia-smi reports for an H200


def test_a_24gib_card_on_an_h200():
    share = utilization_for(24 * GiB, H200, 0.92)
    assert share == 0.157263  # 24576 MiB x 0.92 / 143771 MiB = 0.1572630..., rounded down
    # the server's budget is the card's, to within the rounding (under 150 KB here)
    card_budget = 24 * GiB * 0.92
    assert 0 <= card_budget - H200 * share < H200 / 1e6


def test_the_same_card_keeps_the_profile_share():
    assert utilization_for(24 * GiB, 24 * GiB, 0.92) == 0.92
    assert utilization_for(24 * GiB, 24 * GiB, 1.0) == 1.0


def test_never_above_the_card_budget():
    for total_mib in (24576, 40960, 81920, 97871, 143771, 183359):
        for u in (0.5, 0.85, 0.9, 0.92, 0.93):
            share = utilization_for(24 * GiB, total_mib * MiB, u)
            assert total_mib * MiB * share <= 24 * GiB * u


def test_a_card_bigger_than_the_gpu_is_refused():
    with pytest.raises(ServeError, match="more than this GPU's 24.00 GiB"):
        utilization_for(32 * GiB, 24 * GiB, 0.9)


def test_the_note_names_budget_and_share():
    emu = emulate_card(24 * GiB, H200, 0.92)
    assert emu.note == ("--gpu-mem 24.00 GiB: budget 22.08 GiB (24.00 GiB x 0.92) = --gpu-memory-utilization "
                        "0.157263 of this GPU's 140.40 GiB")


class _Profile:
    """Just what apply_gpu_mem reads and copies."""

    gpu_memory_utilization = 0.92

    def model_copy(self, update):
        p = _Profile()
        p.gpu_memory_utilization = update["gpu_memory_utilization"]
        return p


def test_refused_on_cpu_and_beside_an_explicit_share():
    with pytest.raises(ServeError, match="CUDA GPUs only") as e:
        apply_gpu_mem(_Profile(), 24 * GiB, "cpu", [], lambda: H200, [])
    assert "VLLM_CPU_KVCACHE_SPACE" in e.value.hint
    with pytest.raises(UsageError, match="both set vLLM's memory share"):
        apply_gpu_mem(_Profile(), 24 * GiB, "cuda", ["--gpu-memory-utilization=0.5"], lambda: H200, [])


def test_dry_run_without_a_readable_gpu_keeps_the_profile():
    def unreadable() -> int:
        raise ServeError("nvidia-smi not found")

    notes: list[str] = []
    p = apply_gpu_mem(_Profile(), 24 * GiB, "cuda", [], unreadable, notes, dry_run=True)
    assert p.gpu_memory_utilization == 0.92 and "cannot read this GPU's memory" in notes[0]
    with pytest.raises(ServeError, match="nvidia-smi"):
        apply_gpu_mem(_Profile(), 24 * GiB, "cuda", [], unreadable, [])
    p = apply_gpu_mem(_Profile(), 24 * GiB, "cuda", [], lambda: H200, notes)
    assert p.gpu_memory_utilization == 0.157263
