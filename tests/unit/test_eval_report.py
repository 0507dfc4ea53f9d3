"""The typed eval reports (evaluate/report.py): each kind's JSON document round-trips through its
dataclass (optional sections absent stay absent), and a report of another schema_version or kind is
refused in one line naming the file and the field, as `qwenquant publish --report` shows it (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from qwenquant.atomic import pretty_json
from qwenquant.errors import UsageError
from qwenquant.evaluate.report import (
    KINDS,
    SCHEMA_VERSION,
    EvalReport,
    OfflineReport,
    ServedReport,
    load_report,
)
from qwenquant.reportsink import Written, spare_beside_pid, write_report

from helpers import run_cli

TEXT_SET = {
    "text": "wikitext-2-test",
    "text_set": "wikitext-2-test",
    "repo": "Salesforce/wikitext",
    "revision": "b" * 40,
    "file": "test.parquet",
    "sha256": "c" * 64,
    "license": "CC-BY-SA-3.0",
}
OFFLINE = {
    "arms": {"reference": {"ppl": 7.1}},
    "lm_head": {"ratio": 0.4},
    "mtp": {"change_pct": -0.6},
    "windows": 32,
    "window_len": 256,
    "device": "cpu",
    "forward": "dense",
    "seconds": 12.5,
    "activations": "bf16",
    "artifact": "artifacts/tiny",
    "reference": "models/tiny-reference",
    "reference_check": {"verified": True, "recorded_source": "models/tiny-reference"},
    "root_digest": "a" * 64,
    "goals": {"ppl_delta_pct": {"value": 1.0, "max": 3.0, "met": True}},
}
SERVED = {
    "url": "http://127.0.0.1:8000",
    "model": "q",
    "gate": "tiny-reference",
    "tasks": [{"name": "copy", "passed": 5, "total": 5}],
    "mtp": {"unavailable": "no /metrics", "mean_acceptance_length": None, "over": ["gate tasks"]},
    "min_acceptance_length": None,
    "failures": [],
    "ok": True,
}


def documents() -> dict[str, dict[str, Any]]:
    head = {"schema_version": SCHEMA_VERSION}
    return {
        "offline-text-file": {**OFFLINE, "text": "/data/held-out.txt", **head, "kind": "offline"},
        "offline-text-set": {**OFFLINE, **TEXT_SET, **head, "kind": "offline"},
        "served-url": {**SERVED, **head, "kind": "served"},
        "served-everything": {
            **SERVED,
            "tools": {"cases": []},
            "needle": {"depths": []},
            "served": {"profile": "single-user"},
            "root_digest": "a" * 64,
            **head,
            "kind": "served",
        },
    }


@pytest.mark.parametrize("name", sorted(documents()))
def test_each_kind_round_trips_through_its_typed_report(tmp_path: Path, name: str) -> None:
    doc = documents()[name]
    path = tmp_path / "report.json"
    path.write_bytes(pretty_json(doc))
    report = load_report(path)
    assert type(report) is KINDS[doc["kind"]]
    assert report.to_json() == doc
    again = tmp_path / "again.json"
    assert write_report(again, lambda _: report.to_json(), spare_beside_pid) == Written(again)
    assert again.read_bytes() == path.read_bytes()


def test_a_report_is_built_from_a_runs_result() -> None:
    offline = OfflineReport.of({**OFFLINE, **TEXT_SET})
    assert offline.text_source == TEXT_SET and offline.to_json()["license"] == "CC-BY-SA-3.0"
    served = ServedReport.of(dict(SERVED))
    assert "tools" not in served.to_json() and served.verdict().startswith("eval served: ok: gate tiny-reference")
    served.served, served.root_digest = {"profile": "batch"}, "d" * 64
    assert served.to_json()["root_digest"] == "d" * 64


@pytest.mark.parametrize(
    ("over", "field", "said"),
    [
        ({"schema_version": 2}, "schema_version", "is 2, this qwenquant reads eval reports of schema_version 1"),
        ({"kind": "needle"}, "kind", "is 'needle', not offline | served"),
        ({"tasks_v2": []}, "tasks_v2", "is not a field of an eval report of kind served (schema_version 1)"),
    ],
)
def test_another_schema_version_kind_or_field_is_refused(
    tmp_path: Path, over: dict[str, Any], field: str, said: str
) -> None:
    path = tmp_path / "odd.json"
    path.write_text(json.dumps({**documents()["served-url"], **over}))
    with pytest.raises(UsageError) as e:
        load_report(path)
    assert e.value.message == f"report {path}: {field} {said}"
    assert e.value.exit_code == 2
    with pytest.raises(UsageError, match="^here: kind is 'served', not offline$"):
        OfflineReport.from_json(documents()["served-url"], "here")
    with pytest.raises(
        UsageError, match="^here: goals is missing from an eval report of kind offline .schema_version 1.$"
    ):
        EvalReport.from_json({k: v for k, v in documents()["offline-text-set"].items() if k != "goals"}, "here")


def test_publish_refuses_an_eval_report_of_another_schema_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from test_card import _artifact

    art = _artifact(tmp_path)
    odd = tmp_path / "eval-v2.json"
    odd.write_text(json.dumps({**documents()["offline-text-set"], "schema_version": 2}))
    code, out, err = run_cli(capsys, "publish", str(art), "--repo", "me/q27b", "--dry-run", "--report", str(odd))
    assert code == 2, err
    assert f"report {odd}: schema_version is 2, this qwenquant reads eval reports of schema_version 1" in err
