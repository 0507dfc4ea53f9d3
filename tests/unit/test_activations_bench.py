"""benchmarks/activations_bench.py's pure parts: the kernel vLLM chose (from its log line, benchmarks/serving.py), the figures
read from `qwenquant bench` reports of the shapes bench writes, and the bf16-vs-int8 rows with their
too-good flag. The serving half needs CUDA vLLM and Marlin (benchmarks/RESULTS.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from test_bench_output import ladder_step, run_target, rung, spread, typed

from qwenquant.bench.modes import load_report

from benchmarks import activations_bench as ab
from benchmarks import serving

LOG = """\
(EngineCore_DP0 pid=7) INFO 12-03 10:01:02 [compressed_tensors_wNa16.py:120] Using MachetLinearKernel for CompressedTensorsWNA16
(EngineCore_DP0 pid=7) INFO 12-03 10:01:03 [compressed_tensors_wNa16.py:120] Using MarlinLinearKernel for CompressedTensorsWNA16
"""


def _run(c1: float, c16: float) -> Any:
    ladder = [
        ladder_step(concurrency=1, per_stream_decode_tok_s=spread(c1), aggregate_tok_s=spread(c1 * 0.95)),
        ladder_step(concurrency=16, per_stream_decode_tok_s=spread(c16 / 20), aggregate_tok_s=spread(c16)),
    ]
    flag = {"kind": "cross-check", "check": "x", "where": "A", "figure": "f", "value": 1.0, "line": 0.0, "note": "x"}
    return typed("run", targets=[run_target(ladder=ladder)], flags=[flag])


def _depth(prefill: float, ttft: float) -> Any:
    spread3 = {"min": ttft / 2, "median": ttft, "max": ttft * 1.5}
    return typed("depth", rungs=[rung(prefill_tok_s=prefill, ttft=spread3)])


def test_the_last_kernel_line_per_scheme_is_the_one_that_ran() -> None:
    assert serving.kernels(LOG) == {"CompressedTensorsWNA16": "MarlinLinearKernel"}
    assert serving.kernels("no such line") == {}
    assert ab.not_marlin({"kernels": {"CompressedTensorsWNA16": "MacheteLinearKernel"}}) == [
        "CompressedTensorsWNA16: MacheteLinearKernel"
    ]
    assert ab.not_marlin({"kernels": serving.kernels(LOG)}) == []


def test_figures_come_from_the_reports_and_gains_point_one_way() -> None:
    base = ab.figures(_run(80.0, 1300.0), _depth(9000.0, 0.3), _depth(12000.0, 2.72))
    assert base == {
        "decode_c1_tok_s": 80.0,
        "decode_c16_tok_s": 1300.0,
        "prefill_1x2048_tok_s": 9000.0,
        "burst_prefill_tok_s": 12000.0,
        "burst_ttft_median_s": 2.72,
        "burst_ttft_max_s": 2.72 * 1.5,
        "flags": 1,
    }
    other = ab.figures(_run(76.0, 1274.0), _depth(9900.0, 0.28), _depth(14280.0, 2.27))
    rows = {r["figure"]: r for r in ab.compare(base, other)}
    assert round(rows["decode_c1_tok_s"]["change"], 4) == -0.05
    assert round(rows["burst_prefill_tok_s"]["change"], 4) == 0.19
    assert round(rows["burst_ttft_median_s"]["change"], 4) == round(2.72 / 2.27 - 1, 4)  # shorter TTFT: a gain
    assert not any(r["too_good"] for r in rows.values())
    text = ab.table(list(rows.values()), {"bf16": {"figures": base, "kernels": {}}})
    assert "+19.0%" in text and "-5.0%" in text and "TOO GOOD" not in text


def test_a_gain_past_the_line_is_flagged_and_a_missing_report_is_a_dash() -> None:
    base = ab.figures(_run(80.0, 1300.0), None, _depth(10000.0, 2.0))
    fast = ab.figures(_run(100.0, 1300.0), None, _depth(17000.0, 1.0))
    rows = {r["figure"]: r for r in ab.compare(base, fast)}
    assert rows["decode_c1_tok_s"]["too_good"] and rows["burst_prefill_tok_s"]["too_good"]
    assert rows["burst_ttft_median_s"]["too_good"] and rows["burst_ttft_max_s"]["too_good"]  # halved: +100%
    assert rows["prefill_1x2048_tok_s"]["change"] is None
    text = ab.table(list(rows.values()), {})
    assert text.count("TOO GOOD") == 4 and " - " in text.replace("  ", " ")


def test_the_published_h200_table_comes_from_its_bench_reports() -> None:
    """benchmarks/reports/activations_64layers_h200*.json: every figure of the RESULTS.md table re-derives from the
    six bench reports beside it, and the rows from the figures (the evidence cannot drift from the table)."""
    reports = Path(__file__).resolve().parents[2] / "benchmarks" / "reports"
    top = json.loads((reports / "activations_64layers_h200.json").read_text())
    for setting, s in top["settings"].items():
        parts = [
            load_report(reports / f"activations_64layers_h200-{setting}.{k}.json") for k in ("run", "prefill", "burst")
        ]
        assert ab.figures(*parts) == s["figures"]  # type: ignore[arg-type]
        assert s["kernels"] == {"CompressedTensorsWNA16": "MarlinLinearKernel"}
    assert ab.compare(top["settings"]["bf16"]["figures"], top["settings"]["int8"]["figures"]) == top["rows"]
    assert not any(r["too_good"] for r in top["rows"])


def test_the_benchmarks_force_marlin_as_serve_does() -> None:
    """One spelling of "make Hopper run Marlin": the benchmarks' environment disables exactly the kernels
    `qwenquant serve --activations int8` disables on SM 9.0, and keeps the rest of the environment."""
    assert serving.marlin_only({"A": "1"}) == {
        "A": "1",
        "VLLM_DISABLED_KERNELS": "MacheteLinearKernel,HummingLinearKernel",
    }
