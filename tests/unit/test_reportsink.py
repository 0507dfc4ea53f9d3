"""The one output sink of bench's and eval's reports (reportsink.py): the JSON written where asked or, when
that fails after measuring, in a spare file whose document names it; the JSON on stdout with --json, and
when no file holds it; one JSON document on stdout for a run that fails before its report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from qwenquant.errors import BenchError, UsageError
from qwenquant.reportsink import Sink, Written, deliver, delivered, json_on_failure, write_report

from helpers import run_cli


def _doc(where: Path | None) -> dict[str, Any]:
    return {"json_path": str(where), "ok": True}


def test_the_report_goes_where_asked_as_pretty_sorted_json(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    assert write_report(out, _doc, lambda a: tmp_path / "spare.json") == Written(out)
    assert out.read_text() == json.dumps(_doc(out), indent=2, sort_keys=True) + "\n"


def test_a_failed_write_goes_to_the_spare_which_names_itself(tmp_path: Path) -> None:
    (tmp_path / "gone").write_text("a file where the folder was\n")
    asked = tmp_path / "gone" / "r.json"
    spare = tmp_path / "spare.json"
    written = write_report(asked, _doc, lambda a: spare)
    assert written.path == spare and written.failed == "File exists"
    assert json.loads(spare.read_text())["json_path"] == str(spare)


def test_no_file_at_all_puts_the_json_on_stdout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "gone").write_text("a file where the folder was\n")
    asked = tmp_path / "gone" / "r.json"
    told: list[Written] = []
    sink = Sink(spare=lambda a: tmp_path / "gone" / "spare.json", tell=lambda a, w: told.append(w))
    written = deliver(_doc, asked, sink, as_json=False, show=lambda: print("table"))
    assert written == Written(None, "File exists") and told == [written]
    out = capsys.readouterr().out
    assert out.startswith("table\n") and json.loads(out[len("table\n") :])["json_path"] == str(asked)


def test_json_mode_prints_one_document_and_no_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.json"
    deliver(_doc, out, Sink(), as_json=True, show=lambda: print("table"))
    assert json.loads(capsys.readouterr().out) == _doc(out)


def test_a_run_that_fails_before_its_report_prints_its_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(UsageError), json_on_failure(True, {"mode": "depth"}):
        raise UsageError("no server", hint="start one")
    assert json.loads(capsys.readouterr().out) == {
        "mode": "depth",
        "ok": False,
        "error": "no server",
        "hint": "start one",
        "exit_code": 2,
    }
    with pytest.raises(BenchError), json_on_failure(True, {"mode": "depth"}):
        raise delivered(BenchError("verdict failed"))  # its report was the document already printed
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize(
    ("argv", "head"),
    [
        (("bench", "depth", "http://127.0.0.1:9", "--json"), {"mode": "depth"}),
        (("eval", "served", "http://127.0.0.1:9", "--json"), {"kind": "served"}),
    ],
)
def test_bench_and_eval_print_one_json_document_when_the_server_is_down(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], head: dict[str, str]
) -> None:
    """Nothing listens on port 9: the run fails before its report, and --json still gets its one document."""
    out = ("--out", str(tmp_path / "depth.json")) if argv[0] == "bench" else ()
    code, stdout, err = run_cli(capsys, *argv, *out)
    assert code == 8, err
    doc = json.loads(stdout)
    assert doc == {**head, "ok": False, "error": doc["error"], "hint": doc["hint"], "exit_code": 8}
    assert "Connection refused" in doc["error"] and "error: " in err
