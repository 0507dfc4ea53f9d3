"""The one judging of every bench mode (bench/judge.py) and the tables it drives (bench/table.py), pure."""

from __future__ import annotations

from types import SimpleNamespace

from test_bench_output import cell, ladder_step, run_target, rung, spread, typed

from qwenquant.bench.judge import AUDIT_NOTE, short_stream, too_good_flags
from qwenquant.bench.session import same_server
from qwenquant.bench.table import sections

CFG = SimpleNamespace(
    ttft_floor_s=0.001, too_good=SimpleNamespace(wall_tok_s=1000.0, decode_tok_s=1000.0, prefill_tok_s=100000.0)
)


def test_each_figure_is_held_against_its_own_line() -> None:
    flags = too_good_flags(
        "turn 2",
        {
            "decode_tok_s": 1200.0,
            "wall_tok_s": 900.0,
            "new_prefill_tok_s": 2e5,
            "ttft_s": 0.0005,
            "prompt_tokens": 10**9,
        },
        CFG,
        {"new_prefill_tok_s": "prefill_tok_s"},
    )
    assert [(f.figure, f.line) for f in flags] == [
        ("decode_tok_s", 1000.0),
        ("new_prefill_tok_s", 100000.0),
        ("ttft_s", 0.001),
    ]


def test_a_short_stream_names_how_many_and_how_short() -> None:
    assert short_stream("depth 1024", 64, 64) is None and short_stream("depth 1024", None, 64) is None
    f = short_stream("A c1", 50, 64, "stop", requests=3)
    assert f is not None and f.check == "short-stream"
    assert f.note == (
        "A c1: 3 streams ended short, the first ended after 50 of the 64 tokens asked (finish "
        "reason stop, ignore_eos sent): its rates cover fewer tokens than asked"
    )


def test_a_flagged_figure_reads_audit_in_the_ladder_and_in_every_ratio_of_it() -> None:
    one = cell(
        requests=3,
        figures={
            k: spread(v, None)
            for k, v in (("wall_tok_s", 50.0), ("decode_tok_s", 5000.0), ("ttft_s", 0.1), ("prefill_tok_s", 900.0))
        },
    )
    step = ladder_step(
        cell="n/g/think-off/c1",
        aggregate_tok_s=spread(50.0, None),
        per_stream_wall_tok_s=spread(50.0, None),
        per_stream_decode_tok_s=spread(5000.0, None),
    )
    target = run_target(cells={"n/g/think-off/c1": one}, ladder=[step])
    report = typed(
        "run",
        targets=[target, {**target, "label": "B"}],
        compare={
            "a": "A",
            "b": "B",
            "ratio": "A/B",
            "cells": {"n/g/think-off/c1": {k: spread(1.0, None) for k in one["figures"]}},
            "ladder": [{"concurrency": 1, "aggregate_tok_s": spread(1.0, None)}],
        },
        flags=[
            {
                "kind": "too-good",
                "where": "A n/g/think-off/c1",
                "figure": "decode_tok_s",
                "value": 5000.0,
                "line": 1000.0,
                "note": AUDIT_NOTE,
            }
        ],
    )
    tables = {title.split(":")[0]: rows for title, _, rows in sections(report)}
    assert tables["one stream"][0][3] == "AUDIT" and tables["one stream"][1][3] != "AUDIT"
    assert tables["concurrency ladder"][0][4] == "AUDIT"  # the same requests as the flagged cell
    ratio = tables["ratio A / B"]
    assert ratio[0][2] == "AUDIT" and ratio[0][1] == "1.00 [1.00-1.00]"


def test_one_server_under_two_spellings() -> None:
    assert same_server("http://127.0.0.1:8000", "http://localhost:8000/v1/")
    assert not same_server("http://127.0.0.1:8000", "http://127.0.0.1:8001")


def test_the_depth_png_leaves_out_what_the_table_audits() -> None:
    from qwenquant.bench.longplot import depth_series

    rungs = [
        rung(depth=d, prompt_tokens=d, decode_tok_s=v, wall_tok_s=10.0, prefill_tok_s=100.0)
        for d, v in ((1024, 50.0), (2048, 5000.0))
    ]
    audit = {"kind": "too-good", "where": "depth 2048", "figure": "decode_tok_s", "value": 5000.0, "line": 1000.0}
    report = typed("depth", rungs=rungs, flags=[{**audit, "note": AUDIT_NOTE}])
    rates = dict(depth_series(report)[1].series)
    assert rates["decode"] == [(1024.0, 50.0)] and len(rates["wall"]) == 2
