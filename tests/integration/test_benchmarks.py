"""The scripts under benchmarks/, each in its smallest real mode on the CPU: exit 0, and the table it
prints and the JSON it writes hold the figures it is for. The figures themselves mean nothing at
these sizes; the run proves the script still works with the product as it is (the product's
functions it calls, what it reads from their results).

Covered elsewhere: artifact_compare.py (test_distributed_gptq.py, test_hessian_precision.py; here
too, through quantize_bench.py --gpus 2), deepen_artifact.py (test_deepen_artifact.py), phase_model.py
(tests/unit/test_phase_model.py; here too, through quantize_arms.py report). Scripts that measure
what only CUDA has are tested on their pure parts from small inputs: gdn_transient.py
(tests/unit/test_gdn_transient.py: the CUDA allocator's peaks, no CPU figure), activations_bench.py
(tests/unit/test_activations_bench.py: Marlin's int8 activations exist on CUDA only), serve_cuda_bench.py
(tests/unit/test_serve_cuda_bench.py: a CUDA vLLM's log), mtp_served_compare.py
(tests/unit/test_mtp_served_compare.py: the verdict from two served-eval reports; its CPU mode serves
four vLLM arms, minutes), eval_bench.py's 64-layer projection (tests/unit/test_eval_bench.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO

ENV = dict(
    os.environ,
    QWENQUANT_THREADS="2",
    QWENQUANT_NO_PROGRESS="1",
    PYTHONHASHSEED="0",
    TQDM_DISABLE="1",
    PYTHONPATH=os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]),
)
ENV.pop("QWENQUANT_GPTQ_ENGINE", None)
# the checkpoint quantize_bench.py and quantize_arms.py build: 27B-shaped layers, shrunk to seconds on a CPU
SMALL = ["--layers", "4", "--scale", "0.05", "--vocab", "16384"]


def bench(name: str, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """`python -m benchmarks.NAME ARGS` from the repository root, as benchmarks/README.md runs them."""
    proc = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{name}", *args],
        capture_output=True,
        text=True,
        env=ENV,
        cwd=REPO,
        timeout=timeout,
    )
    assert proc.returncode == 0, f"{name} exited {proc.returncode}:\n{proc.stderr[-4000:]}"
    return proc


@pytest.fixture(scope="module")
def quantized(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """quantize_bench.py with --gpus 2 (the gptq stage again as two CPU processes, then both artifacts
    compared); its work folder (source/, artifact/) is kept for eval_bench.py."""
    work = tmp_path_factory.mktemp("qbench")
    out = work / "quantize_bench.json"
    proc = bench(
        "quantize_bench",
        *SMALL,
        "--quick",
        "--samples",
        "4",
        "--max-length",
        "128",
        "--device",
        "cpu",
        "--gpus",
        "2",
        "--work",
        str(work),
        "--keep",
        "--out",
        str(out),
    )
    return {"work": work, "stdout": proc.stdout, "report": json.loads(out.read_text())}


@pytest.mark.slow
def test_quantize_bench_tables_every_stage_layer_and_phase(quantized: dict) -> None:
    r, table = quantized["report"], quantized["stdout"]
    assert [s["stage"] for s in r["stages"]] == [
        "source",
        "calibration",
        "gptq",
        "lm_head",
        "mtp",
        "textonly",
        "check",
        "eval",
        "manifest",
    ]
    assert [L["layer"] for L in r["gptq_layers"]] == [0, 1, 2, 3]
    assert r["checkpoint"]["dims"]["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
    # the phases come from the run's result (QuantizeResult.timings), one entry per decoder layer
    assert len(r["gptq_layer_phases"]) == 4 and {"calibrate", "gptq", "forward"} <= set(r["gptq_phase_medians"])
    assert r["lm_head_quality"]["gptq"]["kl"] > 0 and r["artifact_bytes"]["total"] < r["source_bytes"]["total"]
    assert r["projection_64_layers"]["caveat"].startswith("small dims")
    for line in (
        "MEASURED",
        "stage gptq",
        "layer 3 full_attention",
        "decoder layer phases, median over layers 1..n",
        "bytes by component",
        "PROJECTION to 64 layers",
    ):
        assert line in table, line


@pytest.mark.slow
def test_quantize_bench_two_processes_against_one(quantized: dict) -> None:
    """gpus_compare.py and artifact_compare.py: every rank's figures (from QuantizeResult.timings) and
    the tolerance verdict of docs/distributed-gptq.md."""
    g, table = quantized["report"]["gpus_compare"], quantized["stdout"]
    assert [r["rank"] for r in g["ranks"]] == [0, 1] and all(r["samples"] == 2 for r in g["ranks"])
    assert all({"calibrate", "reduce", "gptq", "gather"} <= set(r["phase_medians"]) for r in g["ranks"])
    assert g["artifact_difference"]["codes_total"] > 0 and g["within_tolerance"] == (not g["tolerance_problems"])
    for line in (
        "ONE GPU vs 2 GPUS (--gpus 2)",
        "gptq GPU peak: 1 GPU -; per rank rank 0 -, rank 1 -",
        "artifact difference:",
        "tolerance (docs/distributed-gptq.md):",
    ):
        assert line in table, line


@pytest.mark.slow
def test_eval_bench_times_each_layer_of_the_streamed_eval(quantized: dict, tmp_path: Path) -> None:
    out = tmp_path / "eval_bench.json"
    proc = bench(
        "eval_bench",
        *SMALL,
        "--device",
        "cpu",
        "--windows",
        "2",
        "--window-len",
        "64",
        "--work",
        str(quantized["work"]),
        "--out",
        str(out),
    )
    r = json.loads(out.read_text())
    assert r["layers"] == 4 and len(r["layer_seconds"]) == 4 and r["windows"] == 2  # one figure per decoder layer
    assert r["figures"]["kl"] >= 0 and r["projection_64_layers"]["total_seconds"] > 0
    assert "per decoder layer (both arms)" in proc.stdout and "projected: default eval, 64 layers" in proc.stdout


@pytest.mark.slow
def test_quantize_arms_each_step_and_the_report(tmp_path: Path) -> None:
    """quantize_arms.py source, qwenquant, oneshot (compare_llmcompressor.py), report (arms_report.py,
    phase_model.py)."""
    work, out = tmp_path / "arms", tmp_path / "arms.json"
    bench("quantize_arms", "source", *SMALL, "--samples", "4", "--max-length", "128", "--work", str(work))
    for step in ("qwenquant", "oneshot"):
        bench("quantize_arms", step, "--work", str(work))
    proc = bench("quantize_arms", "report", "--work", str(work), "--out", str(out))
    r = json.loads(out.read_text())
    q = json.loads((work / "arm-qwenquant.json").read_text())
    assert len(q["gptq_layer_phases"]) == 4 and {"head_calibration", "identity_proof"} <= set(q["gptq_tail"])
    assert {"qwenquant", "oneshot", "projection_64", "goals"} <= set(r), sorted(r)
    for line in (
        "MEASURED (each arm warmed",
        "gptq after its loop (s): head_calibration",
        "oneshot + save",
        "PROJECTED to 64 layers",
        "GOALS",
    ):
        assert line in proc.stdout, line


@pytest.mark.slow
def test_eval_reference_quality_table_offline(tmp_path: Path) -> None:
    """eval_reference.py --no-serve: the README's quality table for the tiny reference, offline arms
    (the served rows need vLLM and are the real-vLLM tests' business), calibrated on 4 of the shipped
    slices (the README's 64 take minutes on a CPU)."""
    from qwenquant import data_path

    calib = tmp_path / "calib.yaml"
    calib.write_text(
        f"schema_version: 1\nname: tiny-reference-4\ndescription: 4 slices of tiny-reference\n"
        f"source: local\npath: {data_path('calibration/tiny-reference.jsonl')}\ntext_field: text\n"
        "split: train\nnum_samples: 4\nmax_length: 128\nchat_template: false\nshuffle_seed: null\n"
    )
    out = tmp_path / "eval_reference.json"
    proc = bench(
        "eval_reference",
        "--work",
        str(tmp_path / "w"),
        "--out",
        str(out),
        "--windows",
        "4",
        "--no-serve",
        "--calibration",
        str(calib),
    )
    r = json.loads(out.read_text())
    assert set(r["offline"]["arms"]) >= {"reference", "w4a16-body", "w4a16+rtn-head", "artifact"} and r["served"] == {}
    assert proc.stdout.startswith("| arm | perplexity |") and "| artifact |" in proc.stdout
    assert "lm_head alone: KL rtn" in proc.stdout


def test_lm_head_bench_row_chunks_and_the_stage(tmp_path: Path) -> None:
    small = ["--device", "cpu", "--threads", "1", "--vocab", "2048", "--hidden", "256", "--eval-tokens", "256"]
    out = tmp_path / "lm_head.json"
    proc = bench("lm_head_bench", *small, "--calib-tokens", "1024", "--row-chunks", "512,all", "--out", str(out))
    r = json.loads(out.read_text())
    assert r["shape"] == [2048, 256] and [x["method"] for x in r["results"]] == ["rtn", "gptq", "gptq"]
    assert proc.stdout.count("\ngptq ") == 2 and "\nrtn " in proc.stdout
    stage = tmp_path / "lm_head_stage.json"
    proc = bench("lm_head_bench", "--stage", *small, "--out", str(stage))
    s = json.loads(stage.read_text())
    assert s["mode"] == "stage" and set(s["seconds"]) == {"gptq", "rtn", "compare", "pack", "total"}
    assert all(f"\n{part} " in proc.stdout for part in s["seconds"]), proc.stdout


def test_fetch_bench_plain_against_verified(tmp_path: Path) -> None:
    out = tmp_path / "fetch.json"
    proc = bench("fetch_bench", "--size-gib", "0.01", "--repeat", "1", "--out", str(out))
    r = json.loads(out.read_text())
    assert (
        set(r["median"]) == {"raw", "plain", "verified"}
        and r["ratio"] == r["median"]["verified"] / r["median"]["plain"]
    )
    for method in ("raw", "plain", "verified"):
        assert f"\n{method} " in proc.stdout, method
    assert "ratio verified/plain" in proc.stdout


def test_cli_startup_times_every_help(tmp_path: Path) -> None:
    out = tmp_path / "cli.json"
    proc = bench("cli_startup", "--runs", "1", "--out", str(out))
    rows = {r["argv"]: r for r in json.loads(out.read_text())["rows"]}
    assert {"--help", "quantize --help", "bench --help", "eval --help", "serve --help"} <= set(rows), sorted(rows)
    assert all(r["median_s"] > 0 for r in rows.values())
    assert proc.stdout.startswith("command") and "quantize --help" in proc.stdout
