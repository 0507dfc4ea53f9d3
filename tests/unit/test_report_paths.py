"""One rule for every report path (reportdoc.check_report_path): `bench ... --out` (and the PNG beside it)
and `eval ... --report` replace only what qwenquant wrote there as that kind of report; anything else is
refused before measuring (exit 2, the file named, its bytes kept)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qwenquant.bench.output import check_out
from qwenquant.errors import UsageError
from qwenquant.evaluate.inputs import check_report_target


def _bench_report(path: Path, mode: str, png: Path | None = None) -> bytes:
    raw = json.dumps(
        {"schema_version": 2, "mode": mode, "tool": f"qwenquant bench {mode}", "png_path": str(png) if png else None}
    ).encode()
    path.write_bytes(raw)
    return raw


def _refused(call, path: Path, said: str) -> None:
    before = path.read_bytes() if path.is_file() else None
    with pytest.raises(UsageError) as e:
        call()
    assert e.value.exit_code == 2 and said in str(e.value), str(e.value)
    assert (path.read_bytes() if path.is_file() else None) == before


@pytest.mark.parametrize("mode", ["run", "depth", "soak", "turns"])
def test_bench_out_refuses_a_file_qwenquant_did_not_write(tmp_path: Path, mode: str) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text('{"model_type": "qwen3_5"}')
    _refused(lambda: check_out(cfg, mode), cfg, f"--out {cfg} is not a qwenquant bench report; not replacing it")
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    _refused(lambda: check_out(notes, mode), notes, "is not a qwenquant bench report")


def test_bench_out_refuses_another_modes_report_and_replaces_its_own(tmp_path: Path) -> None:
    out = tmp_path / "b.json"
    _bench_report(out, "soak")
    _refused(lambda: check_out(out, "depth"), out, f"--out {out} holds a bench report of mode 'soak', not 'depth'")
    assert check_out(out, "soak") == out  # a report of this mode is qwenquant's to replace


def test_bench_out_refuses_a_png_beside_it_that_its_report_does_not_name(tmp_path: Path) -> None:
    out, png = tmp_path / "b.json", tmp_path / "b.png"
    png.write_bytes(b"\x89PNG my picture")
    _refused(lambda: check_out(out, "depth"), png, f"{png} beside it is not a file qwenquant wrote for that report")
    assert not out.exists()
    _bench_report(out, "depth", png)  # the report that wrote this PNG: both are replaced
    assert check_out(out, "depth") == out
    assert check_out(tmp_path / "t.json", "turns")  # turns draws no PNG: a picture beside it is not its business


def test_a_report_path_inside_an_artifact_is_refused(tmp_path: Path) -> None:
    (tmp_path / "art").mkdir()
    (tmp_path / "art" / "qwenquant-manifest.json").write_text("{}")
    new = tmp_path / "art" / "r.json"
    _refused(lambda: check_out(new, "run"), new, "is inside the artifact")
    _refused(lambda: check_report_target(new, {}, explicit=True, kind="offline"), new, "is inside the artifact")
    assert not new.exists()


def test_eval_report_names_what_is_there(tmp_path: Path) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text('{"model_type": "qwen3_5"}')
    _refused(
        lambda: check_report_target(cfg, {"url": "http://x", "gate": "g"}, explicit=True, kind="served"),
        cfg,
        f"--report {cfg} is not a qwenquant eval report; not replacing it",
    )
    old = tmp_path / "r.json"
    old.write_text(json.dumps({"schema_version": 1, "kind": "offline", "root_digest": "a" * 64}))
    _refused(
        lambda: check_report_target(old, {"url": "http://x"}, explicit=True, kind="served"),
        old,
        "holds an eval report of kind 'offline', not 'served'",
    )
    old.write_text(
        json.dumps(
            {
                "schema_version": 1,
                "kind": "served",
                "root_digest": "a" * 64,
                "gate": "g",
                "served": {"activations": "int8"},
            }
        )
    )
    _refused(
        lambda: check_report_target(
            old, {"root_digest": "a" * 64, "served.activations": "bf16"}, explicit=False, kind="served"
        ),
        old,
        "holds a report of another run (another served.activations)",
    )
    check_report_target(old, {"root_digest": "a" * 64, "served.activations": "int8"}, explicit=False, kind="served")


def test_two_served_configurations_get_two_default_reports(tmp_path: Path) -> None:
    """`eval served --serve ART --activations int8`, then without it: two default paths, never one replaced."""
    from qwenquant.evaluate.report import report_path, served_kind

    root = "c" * 64
    bf16 = report_path(tmp_path / "art", root, served_kind(None, None, []))
    int8 = report_path(tmp_path / "art", root, served_kind("int8", "single-user", []))
    assert bf16.name == f"art.eval-served-{root[:16]}.json"  # the default configuration keeps its name
    assert int8.name == f"art.eval-served-int8-{root[:16]}.json"
    flags = served_kind("bf16", "batch", ["--max-model-len", "4096"])
    assert flags.startswith("eval-served-bf16.batch.flags") and flags != served_kind("bf16", "batch", [])
