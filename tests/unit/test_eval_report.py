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
# a real offline report (int8 activations, the tiny reference on an H200), less where its windows came from
REAL_OFFLINE = Path(__file__).resolve().parents[2] / "benchmarks" / "reports" / "eval_offline_int8_tiny_h200.json"
OFFLINE = {k: v for k, v in json.loads(REAL_OFFLINE.read_text()).items() if k not in ("text", "kind", "schema_version")}
SERVED = {
    "url": "http://127.0.0.1:8000",
    "model": "q",
    "gate": "tiny-reference",
    "tasks": [{"name": "copy", "passed": 5, "total": 5, "min_pass": 5, "failures": []}],
    "mtp": {
        "metrics_present": False,
        "unavailable": "no /metrics",
        "drafts": 0,
        "draft_tokens": 0,
        "accepted_tokens": 0,
        "mean_acceptance_length": None,
        "per_position": {},
        "over": ["gate tasks"],
    },
    "min_acceptance_length": None,
    "failures": [],
    "ok": True,
}
TOOLS = {
    "gate": "tools",
    "cases": [
        {
            "name": "weather",
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "kind": "tool_call",
            "problems": [],
            "calls": [{"name": "get_weather", "arguments": '{"city": "Oslo"}'}],
            "content": "",
            "ok": True,
        },
        {"name": "refused", "tool_choice": "auto", "kind": "error", "problems": ["request failed"], "ok": False},
    ],
    "counts": {"tool_call": 1, "answer": 0, "malformed": 0, "wrong_choice": 0, "error": 1},
}
NEEDLE = {
    "gate": "needle",
    "max_model_len": 4096,
    "limit": 4072,
    "depths": [
        {"depth": 0.5, "needle_tokens": 900, "expect": "7F3A", "prompt_tokens": 1800, "answer": "7F3A", "passed": True},
        {"depth": 1, "needle_tokens": 1790, "expect": "7F3A", "prompt_tokens": 1800, "passed": False, "error": "x"},
    ],
    "passed": 1,
    "total": 2,
}
SERVED_MACHINE = {
    "artifact": "/art",
    "artifact_root_digest": "a" * 64,
    "profile": "single-user",
    "gpu_mem": None,
    "gpu_mem_limit": None,
    "gpus": 1,
    "split": None,
    "extra_vllm_flags": [],
    "device": "cpu",
    "activations": "bf16",
    "vllm_version_installed": "0.32.0",
    "command": "vllm serve /art",
    "server_log": "/art.work/serve/serve.log",
}
SPEC_CHECK = {
    "draft_tokens": 3,
    "prompts": [
        {"prompt_tokens": 3, "one_plus_k": False, "generated": 48, "first_divergence": None},
        {
            "prompt_tokens": 4,
            "one_plus_k": True,
            "generated": 48,
            "first_divergence": 1,
            "with_mtp": [2, 3],
            "without": [5, 3],
            "tie_gap": None,
            "tie": False,
        },
    ],
    "tie_nats": 0.1,
    "diverged": 1,
    "changed": 1,
    "ok": False,
}


def documents() -> dict[str, dict[str, Any]]:
    head = {"schema_version": SCHEMA_VERSION}
    return {
        "offline-text-file": {**OFFLINE, "text": "/data/held-out.txt", **head, "kind": "offline"},
        "offline-text-set": {**OFFLINE, **TEXT_SET, **head, "kind": "offline"},
        "served-url": {**SERVED, **head, "kind": "served"},
        "served-everything": {
            **SERVED,
            "tools": TOOLS,
            "needle": NEEDLE,
            "served": SERVED_MACHINE,
            "spec_check": SPEC_CHECK,
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
    assert offline.text_source.to_json() == TEXT_SET and offline.to_json()["license"] == "CC-BY-SA-3.0"
    served = ServedReport.of(dict(SERVED))
    assert "tools" not in served.to_json() and served.verdict().startswith("eval served: ok: gate tiny-reference")
    served.served, served.root_digest = {**SERVED_MACHINE, "profile": "batch"}, "d" * 64
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


def test_a_part_that_is_not_the_reports_typed_json_is_refused_naming_its_path() -> None:
    """Below the top level every key and type is checked too: a string where a number is, a key no part has,
    a key a part needs, each one line naming the dotted path (exit 2)."""
    doc = documents()["offline-text-set"]
    arms = doc["arms"]
    bad = {**doc, "arms": {**arms, "artifact": {**arms["artifact"], "kl": "0.003"}}}
    with pytest.raises(UsageError, match=r"^here: arms\.artifact\.kl is \"0\.003\" \(input should be a valid number"):
        EvalReport.from_json(bad, "here")
    extra = {**doc, "lm_head": {**doc["lm_head"], "ratio_v2": 1.0}}
    with pytest.raises(UsageError, match=r"^here: lm_head\.ratio_v2 is not a field of an eval report of kind offline"):
        EvalReport.from_json(extra, "here")
    served = documents()["served-everything"]
    gone = {**served, "needle": {k: v for k, v in NEEDLE.items() if k != "limit"}}
    with pytest.raises(UsageError, match=r"^here: needle\.limit is missing from an eval report of kind served"):
        EvalReport.from_json(gone, "here")


def test_the_typed_parts_keep_the_numbers_and_nulls_as_written() -> None:
    """An integer where a number is declared stays an integer; a null stays null; an absent key stays absent."""
    r = ServedReport.of(dict(SERVED, needle=NEEDLE, spec_check=SPEC_CHECK))
    assert r.to_json()["needle"]["depths"][1]["depth"] == 1 and type(r.to_json()["needle"]["depths"][1]["depth"]) is int
    prompts = r.to_json()["spec_check"]["prompts"]
    assert "tie_gap" not in prompts[0] and prompts[1]["tie_gap"] is None
    assert r.spec_check is not None and r.spec_check.prompts[1].with_mtp == [2, 3]
    assert r.needle is not None and r.needle.depths[0].answer == "7F3A"
    assert r.verdict() == "eval served: ok: gate tiny-reference: copy 5/5; needle 1/2 depths; MTP not measured"
