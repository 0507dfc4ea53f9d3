"""The typed bench reports (bench/modes.py, their parts in bench/parts.py): each mode's JSON document round-trips through its dataclass,
and a report of another schema_version, mode or field set is refused in one line naming the file and
the field, as `qwenquant publish --report` shows it (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from qwenquant.atomic import atomic_write_json
from qwenquant.bench.modes import REPORTS, SCHEMA_VERSION, BenchReport, RunReport, load_report
from qwenquant.errors import UsageError

from helpers import run_cli


def rung(**over: Any) -> dict[str, Any]:
    """A depth rung's JSON with the keys every rung has (its depth, seconds, GPU memory, acceptance, ok)."""
    return {
        "depth": 1024,
        "seconds": 1.5,
        "gpu_memory": {"sampled": False, "why": "not sampled: nvidia-smi not found"},
        "acceptance": {"metrics_page": False, "speculative": None},
        "ok": True,
        **over,
    }


def turn(**over: Any) -> dict[str, Any]:
    """A turn's JSON with the keys every turn has (its turn, depth, messages, memory, counters, seconds, ok)."""
    return {
        "turn": 0,
        "depth": 2000,
        "messages": 1,
        "gpu_memory": {"sampled": False, "why": "not sampled: nvidia-smi not found"},
        "prefix_cache": None,
        "acceptance": {"metrics_page": False, "speculative": None},
        "seconds": 1.5,
        "new_tokens": 2000,
        "new_prefill_tok_s": None,
        "ok": True,
        **over,
    }


def spread(v: float, n: int | None = 3) -> dict[str, Any]:
    """A spread's JSON: median, min and max all `v` (over `n` values; None: a spread without a count)."""
    return {"median": v, "min": v, "max": v, **({} if n is None else {"n": n})}


FIGURES = ("wall_tok_s", "decode_tok_s", "ttft_s", "prefill_tok_s")


def cell(**over: Any) -> dict[str, Any]:
    """A run cell's JSON with every key a cell has (one request, its figures and counts)."""
    request = {
        "wall_tok_s": 50.0,
        "decode_tok_s": 55.0,
        "ttft_s": 0.1,
        "prefill_tok_s": 900.0,
        "prompt_tokens": 90,
        "completion_tokens": 64,
        "first_field": "content",
        "finish_reason": "length",
        "text_events": 64,
        "streamed_tokens": 64,
        "streamed_exact": True,
        "reasoning_tokens": None,
    }
    return {
        "prompt": "narrative",
        "sampling": "greedy",
        "thinking": False,
        "concurrency": 1,
        "figures": {k: spread(request[k], 1) for k in FIGURES},
        "round_medians": {k: [request[k]] for k in FIGURES},
        "requests": 1,
        "short_requests": 0,
        "max_tokens": 64,
        "prompt_tokens": 90.0,
        "completion_tokens": 64,
        "first_text_field": {"content": 1},
        "reasoning_streamed": False,
        "per_request": [request],
        "checks": [],
        **over,
    }


def ladder_step(**over: Any) -> dict[str, Any]:
    """A ladder rung's JSON with every key a rung has."""
    return {
        "concurrency": 1,
        "cell": "narrative/greedy/think-off/c1",
        "aggregate_tok_s": spread(50.0),
        "checks": [],
        "aggregate_round_medians": [50.0],
        "per_stream_wall_tok_s": spread(50.0),
        "per_stream_decode_tok_s": spread(55.0),
        **over,
    }


def run_target(**over: Any) -> dict[str, Any]:
    """A run target's JSON: what it is, its thinking note, acceptance, one cell and one ladder rung."""
    return {
        "label": "A",
        "url": "http://127.0.0.1:8000",
        "model": "q",
        "config": "http://127.0.0.1:8000",
        "vllm_version": "0.19.1",
        "thinking": "--thinking off",
        "acceptance": {"metrics_page": True, "speculative": False, "counters": False},
        "cells": {"narrative/greedy/think-off/c1": cell()},
        "ladder": [ladder_step()],
        **over,
    }


OPTIONS = {
    "prompts": ["narrative"],
    "samplings": ["greedy"],
    "thinking": "off",
    "max_tokens": None,
    "repeats": 1,
    "rounds": None,
    "max_concurrency": None,
    "ignore_eos": True,
    "stall_timeout": 300.0,
}
CONFIG = {
    "schema_version": 1,
    "max_tokens": 256,
    "warmup_requests": 2,
    "repeats": 3,
    "rounds": 3,
    "ladder_prompt": "narrative",
    "sampling": {"greedy": {"temperature": 0.0}, "sampled": {"seed": 1234, "temperature": 0.7}},
    "too_good": {
        "wall_tok_s": 1000.0,
        "decode_tok_s": 1000.0,
        "prefill_tok_s": 100000.0,
        "aggregate_tok_s": 10000.0,
        "ratio": 4.0,
    },
    "ttft_floor_s": 0.001,
    "wall_decode_margin": 0.1,
    "prompt_names": ["narrative"],
}
META = {
    "tool": "qwenquant bench",
    "argv": ["qwenquant", "bench", "run", "http://127.0.0.1:8000"],
    "started": "2026-12-04T00:00:00+00:00",
    "python": "3.11.7",
    "gpu_name": None,
}
LONG = {
    "target": {"label": "A", "url": "http://127.0.0.1:8000", "model": "q", "vllm_version": "0.19.1"},
    "max_model_len": 4096,
    "text": {"sha256": "a" * 64, "license": "PSF-2.0", "source": "stdlib"},
    "server": {"process_start_time": 1765000000.25, "supervised": False},
}
WINDOW = {  # ints where the stream's per-request metrics counted, floats where they divided
    "index": 0,
    "stream": None,
    "start": 0,
    "end": 1024,
    "drafts": 300,
    "draft_tokens": 900,
    "accepted": 600,
    "acceptance_rate": 0.6666666666666666,
    "mean_acceptance_length": 3.0,
    "per_position": [0.9, 0.7, 0.4],
}
BODIES: dict[str, dict[str, Any]] = {
    "run": {
        "gpu": {"sampled": False, "why": "not sampled: nvidia-smi not found"},
        "options": OPTIONS,
        "config": CONFIG,
        "targets": [run_target()],
        "compare": None,
        "failure": None,
    },
    "depth": {
        **LONG,
        "output_tokens": 64,
        "depths": [1024, 2048],
        "concurrency": 1,
        "reuse_prefix": False,
        "tokenize": True,
        "nonce": "0a1b2c3d",
        "rungs": [rung(depth=1024, prompt_tokens=1024)],
        "last_ok_depth": 1024,
        "failure": None,
        "draft_tokens": 3,
    },
    "soak": {
        **LONG,
        "soak_tokens": 2048,
        "concurrency": 1,
        "window": 1024,
        "collapse_fraction": 0.5,
        "source": "per-request",
        "token_count_approximate": False,
        "windows": [WINDOW],
        "stream_windows": [[{**WINDOW, "stream": 0}]],
        "streams": [{"error": None, "completion_tokens": 2048, "streamed_tokens": 2048, "streamed_exact": True}],
        "verdict": {"status": "ok", "failures": [], "line": None, "acceptance_judged": True, "flags": []},
        "server_queue": None,
        "decoding_at_once": 1,
        "checks": [],
    },
    "turns": {
        **LONG,
        "output_tokens": 64,
        "turn_tokens": 2048,
        "tokenize": None,
        "nonce": "0a1b2c3d",
        "turns": [turn()],
        "prefix_cache": {"counters": False, "cached": None, "hits": None, "queries": None},
        "last_ok_turn": 0,
        "last_ok_depth": 2100,
        "failure": None,
    },
}


def document(which: str, **over: Any) -> dict[str, Any]:
    """A report's JSON document as `deliver` writes it."""
    return {
        **META,
        "tool": f"qwenquant bench {which}",
        **BODIES[which],
        "flags": [],
        "schema_version": SCHEMA_VERSION,
        "mode": which,
        "png_path": None,
        "json_path": "out.json",
        **over,
    }


def typed(which: str, **over: Any) -> Any:
    """A typed report of `which` mode, read back from its document with `over` in place (the readers' input)."""
    return REPORTS[which].from_json(document(which, **over), "here")


@pytest.mark.parametrize("mode", sorted(BODIES))
def test_each_mode_round_trips_through_its_typed_report(tmp_path: Path, mode: str) -> None:
    doc = document(mode)
    path = tmp_path / "report.json"
    atomic_write_json(path, doc, canonical=False)
    report = load_report(path)
    assert type(report) is REPORTS[mode] and report.mode == mode
    assert report.to_json() == doc
    again = tmp_path / "again.json"
    atomic_write_json(again, report.to_json(), canonical=False)
    assert again.read_bytes() == path.read_bytes()


def test_a_report_is_built_from_its_measured_fields() -> None:
    report = RunReport(**META, **BODIES["run"])
    assert report.to_json() == {**document("run"), "tool": META["tool"], "json_path": None}
    with pytest.raises(TypeError, match="rungs"):
        RunReport(**META, **BODIES["run"], rungs=[])  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("over", "field", "said"),
    [
        ({"schema_version": 3}, "schema_version", "is 3, this qwenquant reads bench reports of schema_version 2"),
        ({"schema_version": "2"}, "schema_version", "is '2', this qwenquant reads bench reports of schema_version 2"),
        ({"mode": "burst"}, "mode", "is 'burst', not run | depth | soak | turns"),
        ({"rungs_v2": []}, "rungs_v2", "is not a field of a bench report of mode depth (schema_version 2)"),
    ],
)
def test_another_schema_version_mode_or_field_is_refused(
    tmp_path: Path, over: dict[str, Any], field: str, said: str
) -> None:
    path = tmp_path / "odd.json"
    path.write_text(json.dumps(document("depth", **over)))
    with pytest.raises(UsageError) as e:
        load_report(path)
    assert e.value.message == f"report {path}: {field} {said}"
    assert e.value.exit_code == 2


def test_a_missing_field_is_named() -> None:
    doc = document("soak")
    del doc["verdict"]
    with pytest.raises(
        UsageError, match="^here: verdict is missing from a bench report of mode soak .schema_version 2.$"
    ):
        BenchReport.from_json(doc, "here")
    with pytest.raises(UsageError, match="^here: mode is 'soak', not depth$"):
        REPORTS["depth"].from_json(document("soak"), "here")


def test_publish_refuses_a_bench_report_of_another_schema_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from test_card import _artifact

    art = _artifact(tmp_path)
    odd = tmp_path / "bench-v3.json"
    odd.write_text(json.dumps(document("turns", schema_version=3)))
    code, out, err = run_cli(capsys, "publish", str(art), "--repo", "me/q27b", "--dry-run", "--report", str(odd))
    assert code == 2, err
    assert f"report {odd}: schema_version is 3, this qwenquant reads bench reports of schema_version 2" in err


def test_typed_parts_keep_their_keys_and_number_types(tmp_path: Path) -> None:
    """A flag's optional keys stay absent unless written, an int stays an int and a float a float: a report
    read back through its typed parts writes the same bytes."""
    flags = [
        {"kind": "cross-check", "check": "queued", "where": "depth 1024", "figure": "waiting requests", "value": 3}
        | {"line": 0, "note": "depth 1024: queued", "requests": 2},
        {"kind": "too-good", "where": "turn 1", "figure": "ttft_s", "value": 0.0001, "line": 0.001, "note": "x"},
    ]
    doc = document("turns", flags=flags, failure={"turn": 1, "depth": 4100, "reason": "stalled"})
    path = tmp_path / "turns.json"
    atomic_write_json(path, doc, canonical=False)
    report = load_report(path)
    assert report.flags[0].value == 3 and isinstance(report.flags[0].value, int) and report.flags[1].check is None
    assert report.failure.turn == 1 and report.prefix_cache.counters is False  # type: ignore[attr-defined]
    assert report.to_json() == doc


def test_a_part_with_a_key_of_its_own_is_refused_naming_it() -> None:
    doc = document("soak", server={"process_start_time": None, "supervised": True, "restarts": 0})
    with pytest.raises(UsageError, match=r"^here: server\.restarts is not as a bench report has it"):
        BenchReport.from_json(doc, "here")
    doc = document("depth", failure={"depth": "deep", "reason": "x"})
    with pytest.raises(UsageError, match=r"^here: failure\.depth is not as a bench report has it"):
        BenchReport.from_json(doc, "here")


def test_a_sampled_gpu_memory_peak_reads_back_as_it_was_written() -> None:
    from qwenquant.bench.gpu import parse_memory
    from qwenquant.bench.parts import GpuMemory

    peak = parse_memory("0, 1000, 80000, 79000\n0, 2000, 80000, 78000\n1, 10, 80000, 79990\n").to_json()
    typed_peak = GpuMemory.model_validate(peak)
    assert typed_peak.to_json() == peak and typed_peak.peak_used_mib == 2000.0
    assert typed_peak.gpus is not None and typed_peak.gpus["0"].samples == 2  # a count stays an int
