"""Stage records: a stage is skipped only when its record proves it complete (no torch here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qwenquant.atomic import pretty_json
from qwenquant.quantize.records import StageRunner, check_record, record_digest

INPUTS = {"upstream": "1" * 64}


def _stage(calls: list[int]):
    def fn(d: Path) -> dict:
        calls.append(1)
        (d / "out.bin").write_bytes(b"payload")
        return {"n": 1}

    return fn


def _run(runner: StageRunner, calls: list[int], inputs=INPUTS):
    return runner.run("demo", inputs, {"p": 1}, _stage(calls))


@pytest.fixture
def ran(tmp_path: Path):
    calls: list[int] = []
    runner = StageRunner(tmp_path)
    _run(runner, calls)
    return tmp_path, calls


def test_complete_record_skips(ran) -> None:
    work, calls = ran
    out = _run(StageRunner(work), calls)
    assert calls == [1] and not out.ran
    rec = json.loads((work / "demo.record.json").read_text())
    assert rec["status"] == "complete" and rec["outputs"] == {"out.bin": out.record["outputs"]["out.bin"]}
    assert rec["record_sha256"] == record_digest(rec)


def _rerun_reason(work: Path, calls: list[int], inputs=INPUTS) -> str:
    out = _run(StageRunner(work), calls, inputs)
    assert out.ran and len(calls) == 2
    assert (work / "demo" / "out.bin").read_bytes() == b"payload"
    return out.reason


def test_missing_record_reruns(ran) -> None:
    work, calls = ran
    (work / "demo.record.json").unlink()
    assert "no completion record" in _rerun_reason(work, calls)


def test_truncated_record_reruns(ran) -> None:
    work, calls = ran
    p = work / "demo.record.json"
    p.write_bytes(p.read_bytes()[:40])
    assert "not valid JSON" in _rerun_reason(work, calls)


@pytest.mark.parametrize(
    "field,value", [("outputs", "x"), ("status", "running"), ("inputs", None), ("record_sha256", 7)]
)
def test_malformed_record_reruns(ran, field, value) -> None:
    work, calls = ran
    p = work / "demo.record.json"
    rec = json.loads(p.read_text())
    rec[field] = value
    if field != "record_sha256":
        rec["record_sha256"] = record_digest(rec)
    p.write_bytes(pretty_json(rec))
    reason = _rerun_reason(work, calls)
    assert "malformed" in reason or "not a complete record" in reason


def test_wrong_self_hash_reruns(ran) -> None:
    work, calls = ran
    p = work / "demo.record.json"
    rec = json.loads(p.read_text())
    rec["result"] = {"n": 2}  # edited without re-hashing
    p.write_bytes(pretty_json(rec))
    assert "self-hash" in _rerun_reason(work, calls)


def test_stale_inputs_rerun(ran) -> None:
    work, calls = ran
    assert "inputs changed (upstream)" in _rerun_reason(work, calls, {"upstream": "2" * 64})


def test_changed_output_reruns(ran) -> None:
    work, calls = ran
    (work / "demo" / "out.bin").write_bytes(b"tampered")
    assert "outputs changed" in _rerun_reason(work, calls)


def test_added_output_file_reruns(ran) -> None:
    work, calls = ran
    (work / "demo" / "extra.txt").write_text("x")
    assert "outputs changed" in _rerun_reason(work, calls)
    assert not (work / "demo" / "extra.txt").exists()


def test_failed_stage_leaves_no_record_and_no_output(tmp_path: Path) -> None:
    def boom(d: Path) -> dict:
        (d / "half.bin").write_bytes(b"x")
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        StageRunner(tmp_path).run("demo", INPUTS, {}, boom)
    assert not (tmp_path / "demo.record.json").exists()
    assert not (tmp_path / "demo").exists()
    assert not list(tmp_path.glob(".demo.*"))


def test_check_record_rejects_other_stage() -> None:
    body = {
        "schema_version": 1,
        "stage": "other",
        "status": "complete",
        "inputs": {},
        "outputs": {},
        "params": {},
        "result": {},
        "started": "",
        "finished": "",
        "tool_versions": {},
    }
    body["record_sha256"] = record_digest(body)
    rec, why = check_record(json.dumps(body).encode(), stage="demo", inputs={}, params={}, outputs_on_disk=dict)
    assert rec is None and "not a complete record of this stage" in why
