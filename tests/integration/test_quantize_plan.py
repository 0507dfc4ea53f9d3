"""`qwenquant quantize --plan` through the real CLI on the tiny model, after one real quantize: it
says every stage is reused; with another calibration set it names calibration and every stage
after it; after a stage's output file is deleted it names that stage; with another CPU thread count
(QWENQUANT_THREADS) it names `threads` as the gptq stage's changed input, which the manifest's stage
records hold; it writes nothing (every path and mtime of the work and artifact folders unchanged),
exits 0 and imports no torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO, qq

pytestmark = pytest.mark.slow

STAGES = ["source", "calibration", "gptq", "lm_head", "mtp", "textonly", "check", "eval"]


def _args(source: Path, out: Path, *extra: str) -> list[str]:
    return [
        "quantize",
        str(source),
        "--recipe",
        "w4a16-int4head",
        "--calibration",
        "tiny-demo",
        "--source-unverified",
        "--device",
        "cpu",
        "--out",
        str(out),
        *extra,
    ]


@pytest.fixture(scope="module")
def built(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("plan")
    out = root / "artifact"
    proc = qq(*_args(tiny_checkpoint, out, "--json"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {"source": tiny_checkpoint, "out": out, "work": root / "artifact.work", "root": root}


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {p.relative_to(root).as_posix(): (p.lstat().st_mtime_ns, p.lstat().st_size) for p in sorted(root.rglob("*"))}


def _plan(built: dict, *extra: str, threads: str | None = None) -> dict:
    """The JSON plan; asserts that it exited 0 and changed nothing under the build's folder.
    `threads`: QWENQUANT_THREADS for the plan (default: the one `qq` builds with)."""
    before = _snapshot(built["root"])
    argv = _args(built["source"], built["out"], "--plan", "--json", *extra)
    if threads is None:
        proc = qq(*argv)
    else:
        env = dict(os.environ, QWENQUANT_THREADS=threads, QWENQUANT_NO_PROGRESS="1", PYTHONHASHSEED="0")
        proc = subprocess.run(
            [sys.executable, "-m", "qwenquant", *argv], capture_output=True, text=True, timeout=600, env=env, cwd=REPO
        )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert _snapshot(built["root"]) == before
    plan = json.loads(proc.stdout)
    assert [s["stage"] for s in plan["stages"]] == STAGES
    return plan


def _actions(plan: dict) -> dict[str, str]:
    return {s["stage"]: "reused" if s["action"] == "reuse" else f"run: {s['reason']}" for s in plan["stages"]}


def test_after_a_full_run_every_stage_is_reused(built: dict) -> None:
    plan = _plan(built)
    assert plan["would_run"] == [] and plan["reused"] == STAGES
    assert plan["work"] == str(built["work"]) and plan["artifact"] == str(built["out"])
    text = qq(*_args(built["source"], built["out"], "--plan"))
    assert text.returncode == 0, text.stderr[-3000:]
    assert [line.split() for line in text.stdout.splitlines()[1:]] == [[name, "reused"] for name in STAGES]
    assert "plan: 0 stage(s) would run, 8 reused (nothing was run or written)" in text.stderr


def test_another_calibration_set_reruns_calibration_and_every_stage_after_it(built: dict) -> None:
    plan = _plan(built, "--calibration", "tiny-reference")
    assert _actions(plan) == {
        "source": "reused",
        "calibration": "run: inputs changed (data, spec)",
        "gptq": "run: calibration re-runs",
        "lm_head": "run: calibration re-runs",
        "mtp": "run: lm_head re-runs",
        "textonly": "run: mtp re-runs",
        "check": "run: textonly re-runs",
        "eval": "run: textonly re-runs",
    }


def test_another_thread_count_reruns_gptq_and_the_manifest_records_the_count(built: dict) -> None:
    manifest = json.loads((built["out"] / "qwenquant-manifest.json").read_text())
    assert {s: manifest["stages"][s]["inputs"].get("threads") for s in STAGES} == {
        **{s: None for s in STAGES},
        "gptq": "2",
        "lm_head": "2",
        "eval": "2",
    }  # qq builds with 2 threads
    assert _actions(_plan(built, threads="2")) == {s: "reused" for s in STAGES}
    assert _actions(_plan(built, threads="1")) == {
        "source": "reused",
        "calibration": "reused",
        "gptq": "run: inputs changed (threads)",
        "lm_head": "run: gptq re-runs",
        "mtp": "run: lm_head re-runs",
        "textonly": "run: mtp re-runs",
        "check": "run: textonly re-runs",
        "eval": "run: textonly re-runs",
    }


def test_a_deleted_stage_output_names_that_stage(built: dict) -> None:
    (built["work"] / "check" / "check.json").unlink()
    try:
        assert _actions(_plan(built)) == {
            **{name: "reused" for name in STAGES[:6]},
            "check": "run: outputs changed on disk (check.json)",
            "eval": "run: check re-runs",
        }
    finally:
        assert qq(*_args(built["source"], built["out"])).returncode == 0  # rebuilds check/ for the next test
    lm_head = built["work"] / "lm_head"
    next(p for p in sorted(lm_head.iterdir()) if p.suffix == ".safetensors").unlink()
    plan = _plan(built)
    assert plan["would_run"] == STAGES[3:]
    assert plan["stages"][3]["reason"].startswith("outputs changed on disk (model-")


def test_the_plan_imports_no_torch(built: dict) -> None:
    probe = (
        "import json, sys\nfrom qwenquant.cli import main\nrc = main(json.loads(sys.argv[1]))\n"
        "print(json.dumps([rc, sorted(m for m in sys.modules if m.split('.')[0] in "
        "('torch', 'transformers', 'llmcompressor', 'compressed_tensors', 'datasets'))]))"
    )
    argv = _args(built["source"], built["out"], "--plan", "--json")
    env = dict(os.environ, QWENQUANT_NO_PROGRESS="1")
    proc = subprocess.run(
        [sys.executable, "-c", probe, json.dumps(argv)], capture_output=True, text=True, env=env, cwd=REPO, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [0, []]


def test_a_moved_source_folder_is_planned_as_the_run_does_it(built: dict, tmp_path: Path) -> None:
    """The same files in another folder: the source stage re-runs (its recorded path changed) and
    writes the outputs of its record, so every later stage is reused; --plan says so, reason by
    reason, and the run does exactly that."""
    import shutil

    assert qq(*_args(built["source"], built["out"])).returncode == 0  # whatever an earlier test removed is back
    first = Path(shutil.copytree(built["source"], tmp_path / "first"))  # copy2: same names, sizes and mtimes
    moved = first.rename(tmp_path / "moved")
    try:
        proc = qq(*_args(moved, built["out"], "--plan", "--json"))
        assert proc.returncode == 0, proc.stderr[-4000:]
        plan = json.loads(proc.stdout)
        assert _actions(plan) == {"source": "run: parameters changed (path)", **{s: "reused" for s in STAGES[1:]}}
        assert (
            "its outputs stay those of its record (the same files by name, size and mtime)" in plan["stages"][0]["note"]
        )
        run = qq(*_args(moved, built["out"], "--json"))
        assert run.returncode == 0, run.stderr[-4000:]
        assert "stage source: running (parameters changed (path))" in run.stderr
        ran = {s for s, v in json.loads(run.stdout)["stages"].items() if v == "ran"}
        assert sorted(ran) == plan["would_run"] == ["source"]
    finally:
        assert qq(*_args(built["source"], built["out"])).returncode == 0  # the record names the fixture's path again


def _plan_then_run(built: dict, *extra: str) -> tuple[dict, dict, str]:
    """(the plan, what the run then did, the run's log) for the build's command with `extra`."""
    plan = _plan(built, *extra)
    run = qq(*_args(built["source"], built["out"], "--json", *extra))
    assert run.returncode == 0, run.stderr[-4000:]
    return plan, json.loads(run.stdout)["stages"], run.stderr


def test_one_calibration_set_named_two_ways_is_one_input(built: dict, tmp_path: Path) -> None:
    """The shipped name and a copy of its definition that names the same data by an absolute path are
    one input: the plan reuses every stage and so does the run, however often the flag alternates."""
    from qwenquant import data_path

    copy = tmp_path / "mine.yaml"
    copy.write_text(
        data_path("calibration", "tiny-demo.yaml")
        .read_text()
        .replace("path: tiny-demo.jsonl", f"path: {data_path('calibration', 'tiny-demo.jsonl')}")
    )
    for calibration in (str(copy), "tiny-demo"):
        plan, ran, _ = _plan_then_run(built, "--calibration", calibration)
        assert plan["would_run"] == [] and [s for s, v in ran.items() if v == "ran"] == []


def test_a_recipe_that_differs_only_in_its_serve_profiles_reruns_only_check(built: dict, tmp_path: Path) -> None:
    """A recipe whose serve profile says something else: check re-runs (it reads the recipe) and writes
    what its record lists, so eval stays reused; the plan says so and the run does exactly that."""
    from qwenquant import data_path

    copy = tmp_path / "mine.yaml"
    text = data_path("recipes", "w4a16-int4head.yaml").read_text()
    assert "description: one stream, lowest latency" in text
    copy.write_text(text.replace("description: one stream, lowest latency", "description: one stream, mine"))
    try:
        plan, ran, log = _plan_then_run(built, "--recipe", str(copy))
        assert _actions(plan) == {
            **{s: "reused" for s in STAGES if s != "check"},
            "check": "run: inputs changed (recipe)",
        }
        assert "a check that passes writes the same check.json" in plan["stages"][6]["note"]
        assert [s for s, v in ran.items() if v == "ran"] == plan["would_run"] == ["check"]
        assert "stage eval: complete, skipped" in log
    finally:
        assert qq(*_args(built["source"], built["out"])).returncode == 0  # the check record of the build's recipe
