"""benchmarks/eval_bench.py's projection of the default eval to 64 layers (pure), on the figures of the
new-machine run on one GPU (benchmarks/reports/eval_bench_4layers_h200_cold.json)."""

from __future__ import annotations

import pytest

from benchmarks import eval_bench as bench

COLD = {
    "windows": 32,
    "window_len": 256,
    "wall_seconds": 126.3,
    "layer_seconds": [85.6, 3.6, 3.6, 3.0],
    "median_layer_seconds": 3.6,
}


def test_first_layer_compilation_is_counted_once_not_per_layer():
    p = bench.project(COLD)
    # 126.3 - 95.8 = 30.5 s fixed; 85.6 - 3.6 = 82 s of first-layer warm-up; 3.6 s x 64 layers
    assert p["fixed_seconds"] == pytest.approx(30.5)
    assert p["first_layer_warmup_seconds"] == pytest.approx(82.0)
    assert p["total_seconds"] == pytest.approx(30.5 + 82.0 + 3.6 * 64)


def test_smaller_runs_scale_per_token_parts_but_not_the_warmup():
    half = dict(COLD, windows=16, wall_seconds=100.0, layer_seconds=[80.0, 2.0, 2.0, 2.0], median_layer_seconds=2.0)
    p = bench.project(half)
    assert p["per_layer_seconds"] == pytest.approx(4.0)  # 2 s at half the tokens
    assert p["fixed_seconds"] == pytest.approx(28.0)  # (100 - 86) x 2
    assert p["first_layer_warmup_seconds"] == pytest.approx(78.0)
    assert p["total_seconds"] == pytest.approx(28.0 + 78.0 + 4.0 * 64)
