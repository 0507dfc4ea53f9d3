"""`--gpu-mem`: the share of a real GPU that gives a smaller card's budget (pure)."""

from __future__ import annotations

import pytest

from qwenquant.errors import ServeError, UsageError
from qwenquant.plan.gpumem import apply_gpu_mem, ballast_holds, ballast_note, emulate_card, utilization_for

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
    assert emu.note == (
        "--gpu-mem 24.00 GiB: budget 22.08 GiB (24.00 GiB x 0.92) = --gpu-memory-utilization "
        "0.157263 of this GPU's 140.40 GiB"
    )


class _Profile:
    """Just what apply_gpu_mem reads and copies."""

    def __init__(self, utilization: float = 0.92) -> None:
        self.gpu_memory_utilization = utilization

    def model_copy(self, update):
        return _Profile(update["gpu_memory_utilization"])


def test_refused_on_cpu_and_soft_beside_an_explicit_share():
    with pytest.raises(UsageError, match="CUDA GPUs only") as e:
        apply_gpu_mem(_Profile(), 24 * GiB, "cpu", [], lambda: H200, [])
    assert "VLLM_CPU_KVCACHE_SPACE" in e.value.hint
    with pytest.raises(UsageError, match="--gpu-mem-soft and --gpu-memory-utilization both set"):
        apply_gpu_mem(_Profile(), 24 * GiB, "cuda", ["--gpu-memory-utilization=0.5"], lambda: H200, [], soft=True)


def test_the_hard_limit_keeps_an_explicit_share_and_says_it_will_not_start():
    """0.18 of an H200 is 25.27 GiB, more than the 24 GiB the ballast leaves: vLLM refuses, as on the card."""
    notes: list[str] = []
    p = apply_gpu_mem(_Profile(0.18), 24 * GiB, "cuda", ["--gpu-memory-utilization", "0.18"], lambda: H200, notes)
    assert p.gpu_memory_utilization == 0.18
    assert notes == [
        "--gpu-mem 24.00 GiB with an explicit --gpu-memory-utilization 0.18: vLLM's budget is 25.27 GiB "
        "of this GPU's 140.40 GiB, more than the 24.00 GiB left to it: vLLM will refuse to start, as on "
        "the card"
    ]
    notes.clear()
    apply_gpu_mem(_Profile(0.15), 24 * GiB, "cuda", ["--gpu-memory-utilization=0.15"], lambda: H200, notes)
    assert notes[0].endswith("vLLM's budget is 21.06 GiB of this GPU's 140.40 GiB")


def test_soft_says_there_is_no_ballast():
    notes: list[str] = []
    apply_gpu_mem(_Profile(), 24 * GiB, "cuda", [], lambda: H200, notes, soft=True)
    assert notes[1].startswith("--gpu-mem-soft: no ballast")


def test_ballast_holds_all_but_the_card_of_each_gpu():
    """An idle H200 (143771 MiB, 143210 MiB free as nvidia-smi reports) and one with 30000 MiB in use."""
    gpus = [("0", H200, 143210 * MiB), ("1", H200, 113771 * MiB)]
    assert ballast_holds(24 * GiB, gpus) == [(143210 - 24576) * MiB, (113771 - 24576) * MiB]
    assert ballast_note(24 * GiB, gpus[:1]) == (
        "--gpu-mem 24.00 GiB is a hard limit: a ballast process holds all but 24.00 GiB of the free memory, its own "
        "CUDA context included (GPU 0: 115.85 GiB of 140.40 GiB (139.85 GiB free now)), from before vLLM starts "
        "until after it stops (--gpu-mem-soft: the budget alone)"
    )
    with pytest.raises(ServeError, match="GPU 1 has 20.00 GiB free of 140.40 GiB: less than --gpu-mem 24.00 GiB") as e:
        ballast_holds(24 * GiB, [("0", H200, 100 * GiB), ("1", H200, 20 * GiB)])
    assert "GPU 0" not in e.value.message and "lower --gpu-mem" in e.value.hint


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
