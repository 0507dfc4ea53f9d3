"""A bench report's tree is typed to its leaves (bench/runparts.py): a `bench run` report's targets, their cells,
requests and ladder rungs, the comparison, the GPU's clocks, the options and the config, and a long run's
target, are read back as typed parts; a key or a type the part does not have is refused in one line naming
the field's path (exit 2), as for every other part; and the typed report writes back the document it read."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from test_bench_output import document, ladder_step, run_target, spread, typed

from qwenquant.atomic import atomic_write_json
from qwenquant.bench.modes import BenchReport, load_report
from qwenquant.bench.parts import GpuMemory, Range
from qwenquant.bench.runparts import CellReport, Comparison, GpuClocks, LadderRung, RunTarget, TargetInfo
from qwenquant.errors import UsageError

from helpers import run_cli

CELL = "narrative/greedy/think-off/c1"
GPU = {
    "sampled": True,
    "samples": 12,
    "gpu_name": "NVIDIA H100 80GB HBM3",
    "interval_ms": 200,
    "sm_mhz": {"min": 1700.0, "median": 1715.0, "max": 1740.0},
    "sm_max_mhz": 1980.0,
    "power_w": {"min": 300.25, "median": 305.75, "max": 311.25},
    "power_limit_w": 700.0,
    "max_temp_c": 46.0,
    "throttle_reasons": {"sw_power_cap": 4},
    "throttled_fraction": 1 / 3,
    "throttled": True,
}
COMPARE = {
    "a": "A",
    "b": "B",
    "ratio": "A/B",
    "cells": {CELL: {"wall_tok_s": spread(2.0), "decode_tok_s": spread(2.0), "ttft_s": None, "prefill_tok_s": None}},
    "ladder": [{"concurrency": 1, "aggregate_tok_s": spread(2.0)}],
}


def _run_doc(**over: Any) -> dict[str, Any]:
    """A compare report's document: two targets, the GPU sampled, the ratios A/B."""
    return document("run", targets=[run_target(), run_target(label="B")], gpu=GPU, compare=COMPARE, **over)


def _refused(doc: dict[str, Any]) -> str:
    with pytest.raises(UsageError) as e:
        BenchReport.from_json(doc, "here")
    assert e.value.exit_code == 2 and "\n" not in e.value.message
    return e.value.message


def test_a_run_report_reads_back_typed_to_its_leaves() -> None:
    report = typed("run", targets=[run_target(), run_target(label="B")], gpu=GPU, compare=COMPARE)
    target = report.targets[0]
    assert isinstance(target, RunTarget) and isinstance(target.cells[CELL], CellReport)
    cell = target.cells[CELL]
    assert isinstance(cell.figures.wall_tok_s, Range) and cell.figures.wall_tok_s.n == 1
    assert cell.per_request[0].completion_tokens == 64 and isinstance(cell.per_request[0].completion_tokens, int)
    assert isinstance(target.ladder[0], LadderRung) and target.ladder[0].aggregate_tok_s.median == 50.0
    assert isinstance(report.compare, Comparison) and report.compare.cells[CELL].ttft_s is None
    assert isinstance(report.gpu, GpuClocks) and report.gpu.sm_mhz.n is None and report.gpu.throttled is True
    assert report.options.stall_timeout == 300.0 and report.config.too_good.ratio == 4.0


def test_a_typed_run_report_writes_back_the_document_it_read(tmp_path: Path) -> None:
    doc = _run_doc()
    path = tmp_path / "run.json"
    atomic_write_json(path, doc, canonical=False)
    assert load_report(path).to_json() == doc


def test_a_report_written_before_a_key_was_added_still_loads() -> None:
    """A cell without max_tokens and a ladder rung without cell and checks (reports of the first schema 2 runs)."""
    target = run_target()
    del target["cells"][CELL]["max_tokens"]
    rung = ladder_step()
    del rung["cell"], rung["checks"]
    target["ladder"] = [rung]
    doc = document("run", targets=[target])
    report = BenchReport.from_json(doc, "here")
    assert report.targets[0].cells[CELL].max_tokens is None and report.targets[0].ladder[0].checks == []  # type: ignore[attr-defined]
    assert report.to_json() == doc  # the keys it lacked stay absent


def _with(doc: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out


@pytest.mark.parametrize(
    ("path", "value", "named"),
    [
        (("targets", 0, "server_pid"), 7, "targets.0.server_pid"),
        (("targets", 1, "label"), 2, "targets.1.label"),
        (("targets", 0, "cells", CELL, "requests"), "3", f"targets.0.cells.{CELL}.requests"),
        (("targets", 0, "cells", CELL, "requests"), 3.0, f"targets.0.cells.{CELL}.requests"),
        (("targets", 0, "cells", CELL, "speed"), 1.0, f"targets.0.cells.{CELL}.speed"),
        (
            ("targets", 0, "cells", CELL, "figures", "wall_tok_s", "mean"),
            1.0,
            f"targets.0.cells.{CELL}.figures.wall_tok_s.mean",
        ),
        (
            ("targets", 0, "cells", CELL, "figures", "wall_tok_s", "median"),
            "fast",
            f"targets.0.cells.{CELL}.figures.wall_tok_s.median",
        ),
        (
            ("targets", 0, "cells", CELL, "per_request", 0, "streamed_exact"),
            1,
            f"targets.0.cells.{CELL}.per_request.0.streamed_exact",
        ),
        (("targets", 0, "ladder", 0, "concurrency"), "1", "targets.0.ladder.0.concurrency"),
        (("targets", 0, "ladder", 0, "peak"), 1, "targets.0.ladder.0.peak"),
        (("targets", 0, "ladder", 0, "aggregate_tok_s", "n"), 1.5, "targets.0.ladder.0.aggregate_tok_s.n"),
        (("targets", 0, "acceptance", "speculative"), "yes", "targets.0.acceptance.speculative"),
        (("gpu", "samples"), 12.0, "gpu.samples"),
        (("gpu", "clock"), 1, "gpu.clock"),
        (("gpu", "sm_mhz", "p99"), 1.0, "gpu.sm_mhz.p99"),
        (("gpu", "throttle_reasons", "sw_power_cap"), 0.5, "gpu.throttle_reasons.sw_power_cap"),
        (("compare", "cells", CELL, "wall_tok_s", "min"), None, f"compare.cells.{CELL}.wall_tok_s.min"),
        (("compare", "ladder", 0, "ratio"), 2.0, "compare.ladder.0.ratio"),
        (("options", "repeats"), "2", "options.repeats"),
        (("config", "too_good", "ratio"), "4", "config.too_good.ratio"),
        (("config", "prompts"), {}, "config.prompts"),
    ],
)
def test_a_key_or_type_a_run_part_lacks_is_refused_naming_its_path(
    path: tuple[Any, ...], value: Any, named: str
) -> None:
    said = _refused(_with(_run_doc(), path, value))
    assert said.startswith(f"here: {named} is not as a bench report has it ("), said


@pytest.mark.parametrize(
    ("path", "value", "named"),
    [
        (("target", "port"), 8000, "target.port"),
        (("target", "gpus"), "2", "target.gpus"),
        (("rungs", 0, "gpu_memory", "gpus"), {"0": {"peak_used_mib": 1.0}}, "rungs.0.gpu_memory.gpus.0.total_mib"),
        (("rungs", 0, "ttft"), {"min": 1.0, "median": 1.0, "max": 1.0, "p90": 1.0}, "rungs.0.ttft.p90"),
    ],
)
def test_a_long_runs_target_gpu_memory_and_spreads_are_checked_too(
    path: tuple[Any, ...], value: Any, named: str
) -> None:
    said = _refused(_with(document("depth"), path, value))
    assert said.startswith(f"here: {named} is not as a bench report has it ("), said


def test_a_long_runs_target_and_memory_read_back_typed() -> None:
    peak = {"peak_used_mib": 1021.0, "total_mib": 81559.0, "min_free_mib": 79979.0, "samples": 4}
    memory = {"sampled": True, "interval_ms": 100, "gpus": {"0": peak}, "peak_used_mib": 1021.0}
    rung = {**document("depth")["rungs"][0], "gpu_memory": memory}
    report = typed("depth", rungs=[rung])
    assert isinstance(report.target, TargetInfo) and report.target.vllm_version == "0.19.1"
    mem = report.rungs[0].gpu_memory
    assert isinstance(mem, GpuMemory) and mem.gpus["0"].samples == 4 and isinstance(mem.gpus["0"].samples, int)


def test_publish_refuses_a_bench_report_with_an_odd_cell_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from test_card import _artifact

    art = _artifact(tmp_path)
    odd = tmp_path / "bench-odd-cell.json"
    odd.write_text(json.dumps(_with(_run_doc(), ("targets", 0, "cells", CELL, "requests"), "3")))
    code, _, err = run_cli(capsys, "publish", str(art), "--repo", "me/q27b", "--dry-run", "--report", str(odd))
    assert code == 2, err
    assert f"report {odd}: targets.0.cells.{CELL}.requests is not as a bench report has it" in err


def test_load_report_refuses_an_odd_ladder_rung_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    path.write_text(json.dumps(_with(_run_doc(), ("targets", 0, "ladder", 0, "queue"), 1)))
    with pytest.raises(UsageError) as e:
        load_report(path)
    assert e.value.exit_code == 2
    assert e.value.message.startswith(f"report {path}: targets.0.ladder.0.queue is not as a bench report has it (")
