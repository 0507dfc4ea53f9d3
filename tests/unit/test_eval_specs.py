"""What `eval served` reads from JSON files (evaluate/specs.py): the gate, the shipped tool-calling cases and the
needle task, typed. A malformed gate (the user's or a shipped one) or task set is refused before any server is
asked: exit 2, one line naming the file and the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qwenquant.errors import UsageError
from qwenquant.evaluate import served, servedrun, specs

from helpers import run_cli

DEAD = "http://127.0.0.1:9"  # nothing listens: a refusal here is made before any request
GOOD_TASK = {"name": "t", "cases": [{"prompt": "def", "expect": " f"}]}


def _write(folder: Path, name: str, body: object) -> Path:
    path = folder / name
    path.write_text(json.dumps(body))
    return path


def _refused(call, *where: str) -> str:
    with pytest.raises(UsageError) as e:
        call()
    line = e.value.message
    assert e.value.exit_code == 2 and "\n" not in line, line
    for w in where:
        assert w in line, line
    return line


@pytest.mark.parametrize(
    ("gate", "field"),
    [
        ({"tasks": [{**GOOD_TASK, "max_tokens": "16"}]}, "tasks[0].max_tokens"),
        ({"tasks": [{**GOOD_TASK, "min_pass": -1}]}, "tasks[0].min_pass"),
        (
            {"tasks": [{**GOOD_TASK, "cases": [{"prompt": "a", "expect": "b", "max_tokens": 1.5}]}]},
            "tasks[0].cases[0].max_tokens",
        ),
        ({"name": 7, "tasks": [GOOD_TASK]}, "name"),
        ({"tasks": [GOOD_TASK], "acceptance_runs": [{"prompt": "x", "max_tokens": "many"}]}, "acceptance_runs[0]"),
    ],
)
def test_a_gate_file_with_a_wrong_field_is_refused_naming_file_and_field(
    tmp_path: Path, gate: dict, field: str
) -> None:
    path = _write(tmp_path, "gate.json", gate)
    _refused(lambda: served.load_gate(str(path)), f"gate {path}: {field}")


def test_a_good_gate_loads_typed_with_its_defaults(tmp_path: Path) -> None:
    path = _write(tmp_path, "gate.json", {"name": "g", "note": "kept out", "tasks": [GOOD_TASK]})
    gate = served.load_gate(str(path))
    assert isinstance(gate, specs.Gate) and gate.name == "g" and gate.acceptance_runs == []
    assert (gate.tasks[0].max_tokens, gate.tasks[0].needs) == (16, 1)
    shipped = served.load_gate("tiny-reference")
    assert shipped.tasks and all(isinstance(t, specs.GateTask) for t in shipped.tasks)
    assert [g.name for g in served.describe_gates()] == ["tiny-reference"]


@pytest.fixture
def shipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the shipped evalsets folder that the loaders read instead of the package's."""
    folder = tmp_path / "evalsets"
    folder.mkdir()
    for p in specs.evalsets_dir().iterdir():
        if p.name.endswith(".json"):
            (folder / p.name).write_bytes(p.read_bytes())
    monkeypatch.setattr(specs, "evalsets_dir", lambda: folder)
    monkeypatch.setattr(served, "evalsets_dir", lambda: folder)
    return folder


def _damage(folder: Path, name: str, change) -> Path:
    path = folder / f"{name}.json"
    body = json.loads(path.read_text())
    change(body)
    path.write_text(json.dumps(body))
    return path


@pytest.mark.parametrize(
    ("name", "change", "field"),
    [
        ("needle", lambda b: b.update(depths="half"), "depths"),
        ("needle", lambda b: b.update(answer_tokens="24"), "answer_tokens"),
        ("needle", lambda b: b.pop("filler"), "filler"),
        ("tools", lambda b: b["cases"][1].update(tool_choice="always"), "cases[1].tool_choice"),
        ("tools", lambda b: b["cases"][0]["tools"][0].update(type="code"), "cases[0].tools[0].type"),
        ("tools", lambda b: b["cases"][2].update(max_tokens=0), "cases[2].max_tokens"),
    ],
)
def test_a_damaged_shipped_task_set_is_refused_before_any_server_is_asked(
    shipped: Path, name: str, change, field: str
) -> None:
    path = _damage(shipped, name, change)
    ask = servedrun.ServedAsk(gate="none", tools=name == "tools", needle=name == "needle")
    _refused(ask.check, f"task set {path}: {field}")


def test_a_damaged_shipped_gate_is_refused_naming_it(shipped: Path) -> None:
    path = _damage(shipped, "tiny-reference", lambda b: b["tasks"][0].update(min_pass="all"))
    _refused(lambda: served.load_gate("tiny-reference"), f"gate {path}: tasks[0].min_pass")


def test_the_shipped_task_sets_load_as_written() -> None:
    for load, name in ((specs.tools_spec, "tools"), (specs.needle_spec, "needle")):
        raw = json.loads((specs.evalsets_dir() / f"{name}.json").read_text())
        assert load().to_json() == raw


def test_eval_served_refuses_a_malformed_gate_with_exit_2_and_one_line(tmp_path: Path, capsys) -> None:
    path = _write(tmp_path, "gate.json", {"tasks": [{**GOOD_TASK, "max_tokens": "16"}]})
    code, _, err = run_cli(capsys, "eval", "served", DEAD, "--gate", str(path))
    assert code == 2, err
    assert f"gate {path}: tasks[0].max_tokens: input should be a valid integer" in " ".join(err.split())
