"""pipeline.quantize and status.plan_quantize, driven with small in-test stage lists (no torch, no
model): the order and progress come from the list, what the manifest says comes from the stages'
own `manifest` hooks, records make a re-run skip, the artifact is the last checkpoint stage's
folder plus the manifest, a failing stage leaves nothing behind, and the plan says what a run
would do without doing it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from qwenquant.atomic import atomic_write_json
from qwenquant.errors import OutFolderError, StageError, UsageError
from qwenquant.manifest import MANIFEST_NAME, verify_artifact
from qwenquant.quantize import pipeline
from qwenquant.quantize.stage import Stage, StageContext
from qwenquant.quantize.status import plan_quantize
from qwenquant.recipe import load_recipe


class Toy:
    """Four stages: a source and a calibration that add their manifest sections, a checkpoint
    stage with an inner progress task that adds the quality section, and a check."""

    def __init__(self) -> None:
        self.weights = b"weights-1"
        self.calls: list[str] = []
        self.fail_check = False
        self.preflights: list[Path] = []

    def source(self, ctx: StageContext, out: Path) -> dict:
        self.calls.append("source")
        atomic_write_json(out / "source.json", {"kind": "local-unverified", "files": {}})
        return {"kind": "local-unverified"}

    def calibration(self, ctx: StageContext, out: Path) -> dict:
        self.calls.append("calibration")
        (out / "tokens.bin").write_bytes(b"123")
        return {"fingerprint_sha256": "f" * 64}

    def head(self, ctx: StageContext, out: Path) -> dict:
        self.calls.append("head")
        time.sleep(0.05)
        ctx.timings.add_tail({"rows": 0.25})  # a stage's own parts, as the gptq stage adds its engine's
        tick = ctx.progress_for("head rows")
        for i in (1, 2):
            if tick:
                tick(i, 2)
        (out / "config.json").write_text("{}")
        (out / "model.safetensors").write_bytes(self.weights)
        return {"head": {"method": "toy"}}

    def check(self, ctx: StageContext, out: Path) -> dict:
        self.calls.append("check")
        if self.fail_check:
            raise StageError("toy check failed")
        return {"problems": 0}

    def stages(self) -> tuple[Stage, ...]:
        return (
            Stage(
                "source",
                lambda ctx: {"path": str(ctx.source)},
                lambda ctx: {},
                self.source,
                manifest=lambda o: {"source": json.loads((o.dir / "source.json").read_text())},
                preflight=lambda source, recipe: self.preflights.append(source),
            ),
            Stage(
                "calibration",
                lambda ctx: {"source": ctx.digest("source")},
                lambda ctx: {},
                self.calibration,
                manifest=lambda o: {"calibration": dict(o.result)},
            ),
            Stage(
                "head",
                lambda ctx: {"calibration": ctx.digest("calibration"), "weights": self.weights.decode()},
                lambda ctx: {"device": ctx.device},
                self.head,
                builds_checkpoint=True,
                manifest=lambda o: {"quality": dict(o.result)},
                tasks=("head rows",),
            ),
            Stage(
                "check",
                lambda ctx: {"head": ctx.digest("head")},
                lambda ctx: {},
                self.check,
                manifest=lambda o: {"quality": {"checked": o.result["problems"] == 0}},
            ),
        )


@pytest.fixture
def toy() -> Toy:
    return Toy()


def _opts(tmp_path: Path, **kw) -> pipeline.QuantizeOptions:
    recipe = load_recipe("w4a16-int4head")
    (tmp_path / "src").mkdir(exist_ok=True)
    return pipeline.QuantizeOptions(
        tmp_path / "src", recipe, recipe.calibration, kw.pop("out", tmp_path / "art"), device="cpu", **kw
    )


def _quantize(toy: Toy, tmp_path: Path, progress=None) -> pipeline.QuantizeResult:
    return pipeline.quantize(_opts(tmp_path), progress, stages=toy.stages())


def test_stages_run_in_list_order_with_progress_from_the_list(toy: Toy, tmp_path: Path) -> None:
    steps: list[tuple] = []
    res = _quantize(toy, tmp_path, lambda *a: steps.append(a))
    assert toy.calls == ["source", "calibration", "head", "check"]
    assert steps == [
        ("source", None, 0, 5),
        ("calibration", None, 1, 5),
        ("head", None, 2, 5),
        ("head", "head rows", 1, 2),
        ("head", "head rows", 2, 2),
        ("check", None, 3, 5),
        ("manifest", None, 4, 5),
        ("done", None, 5, 5),
    ]
    assert toy.preflights == [(tmp_path / "src").resolve()]
    assert res.stages == {"source": "ran", "calibration": "ran", "head": "ran", "check": "ran"}
    art = tmp_path / "art"
    assert sorted(p.name for p in art.iterdir()) == [
        "config.json",
        "model.safetensors",
        MANIFEST_NAME,
        pipeline.QUALITY_FILE,
    ]
    assert (art / "model.safetensors").read_bytes() == b"weights-1"
    assert verify_artifact(art).ok and res.root_digest == verify_artifact(art).root_digest


def test_the_manifest_sections_are_what_the_stages_contribute(toy: Toy, tmp_path: Path) -> None:
    res = _quantize(toy, tmp_path)
    manifest = json.loads((tmp_path / "art" / MANIFEST_NAME).read_text())
    assert manifest["source"] == {"kind": "local-unverified", "files": {}}
    assert manifest["calibration"] == {"fingerprint_sha256": "f" * 64} == res.calibration
    assert manifest["quality"] == {"head": {"method": "toy"}, "checked": True} == res.quality
    assert json.loads((tmp_path / "art" / pipeline.QUALITY_FILE).read_text()) == res.quality
    assert list(manifest["stages"]) == ["calibration", "check", "head", "source"]  # canonical JSON sorts
    assert manifest["stages"]["head"]["params"] == {"device": "cpu"}
    assert all((tmp_path / "art.work" / f"{n}.record.json").is_file() for n in res.stages)


def test_a_stage_without_manifest_hooks_leaves_the_sections_empty(toy: Toy, tmp_path: Path) -> None:
    bare = tuple(Stage(s.name, s.inputs, s.params, s.run, s.builds_checkpoint, tasks=s.tasks) for s in toy.stages())
    pipeline.quantize(_opts(tmp_path), stages=bare)
    manifest = json.loads((tmp_path / "art" / MANIFEST_NAME).read_text())
    assert (manifest["source"], manifest["calibration"], manifest["quality"]) == ({}, {}, {})


def test_two_stages_adding_the_same_section_is_refused(toy: Toy, tmp_path: Path) -> None:
    stages = toy.stages()
    twice = stages + (
        Stage(
            "again",
            lambda ctx: {},
            lambda ctx: {},
            lambda ctx, d: {},
            manifest=lambda o: {"quality": {"checked": False}},
        ),
    )
    with pytest.raises(ValueError, match="stage again adds 'quality' to the manifest again"):
        pipeline.quantize(_opts(tmp_path), stages=twice)


def test_an_undeclared_progress_task_is_refused(toy: Toy, tmp_path: Path) -> None:
    stages = list(toy.stages())
    stages[2] = Stage("head", stages[2].inputs, stages[2].params, toy.head, builds_checkpoint=True)  # no tasks
    with pytest.raises(ValueError, match="progress task 'head rows' is not declared by stage 'head'"):
        pipeline.quantize(_opts(tmp_path), lambda *a: None, stages=stages)


def test_rerun_skips_every_stage_and_writes_the_same_manifest(toy: Toy, tmp_path: Path) -> None:
    first = _quantize(toy, tmp_path)
    manifest = (tmp_path / "art" / MANIFEST_NAME).read_bytes()
    toy.calls.clear()
    again = _quantize(toy, tmp_path)
    assert toy.calls == [] and set(again.stages.values()) == {"skipped"}
    assert again.root_digest == first.root_digest
    assert (tmp_path / "art" / MANIFEST_NAME).read_bytes() == manifest


def test_the_result_times_each_stage_that_ran_and_no_reused_one(toy: Toy, tmp_path: Path) -> None:
    """QuantizeResult.timings: the wall seconds of every stage that ran, what a stage added of its own
    parts; a stage reused from its record has no entry (it ran no time in this run)."""
    first = _quantize(toy, tmp_path)
    assert list(first.timings.stages) == ["source", "calibration", "head", "check"]
    assert 0.05 <= first.timings.stages["head"] < 5 and first.timings.gptq_tail == {"rows": 0.25}
    assert first.to_dict()["timings"]["stages"] == first.timings.stages
    toy.weights = b"weights-2"
    again = _quantize(toy, tmp_path)
    assert list(again.timings.stages) == ["head", "check"] and again.timings.gptq_tail == {"rows": 0.25}


def test_changed_input_reruns_that_stage_and_those_reading_its_outputs(toy: Toy, tmp_path: Path) -> None:
    first = _quantize(toy, tmp_path)
    toy.calls.clear()
    toy.weights = b"weights-2"
    again = _quantize(toy, tmp_path)
    assert toy.calls == ["head", "check"]
    assert again.stages == {"source": "skipped", "calibration": "skipped", "head": "ran", "check": "ran"}
    assert again.root_digest != first.root_digest
    assert (tmp_path / "art" / "model.safetensors").read_bytes() == b"weights-2"


def test_failing_stage_leaves_no_record_and_no_artifact(toy: Toy, tmp_path: Path) -> None:
    toy.fail_check = True
    with pytest.raises(StageError, match="toy check failed"):
        _quantize(toy, tmp_path)
    work = tmp_path / "art.work"
    assert not (tmp_path / "art").exists() and not (work / "check.record.json").exists()
    assert (work / "head.record.json").is_file()
    assert not list(work.glob(".*.partial")) and not list(tmp_path.glob(".art.*"))


def test_out_inside_the_source_is_refused(toy: Toy, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="overlaps the source folder"):
        pipeline.quantize(_opts(tmp_path, out=tmp_path / "src" / "art"), stages=toy.stages())
    assert toy.calls == [] and toy.preflights == []


def _snapshot(root: Path) -> dict[str, tuple]:
    return {
        p.relative_to(root).as_posix(): (p.stat().st_mtime_ns, p.stat().st_size, p.is_dir())
        for p in sorted(root.rglob("*"))
    }


def test_plan_before_any_run_says_every_stage_runs_and_creates_nothing(toy: Toy, tmp_path: Path) -> None:
    plan = plan_quantize(_opts(tmp_path), stages=toy.stages())
    assert [(s.stage, s.describe()) for s in plan.stages] == [
        ("source", "would run: no completion record"),
        ("calibration", "would run: source re-runs"),
        ("head", "would run: calibration re-runs"),
        ("check", "would run: head re-runs"),
    ]
    assert toy.calls == [] and sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_plan_after_a_run_names_what_changed_and_writes_nothing(toy: Toy, tmp_path: Path) -> None:
    _quantize(toy, tmp_path)
    toy.calls.clear()
    before = _snapshot(tmp_path)
    assert plan_quantize(_opts(tmp_path), stages=toy.stages()).would_run == []
    toy.weights = b"weights-2"
    plan = plan_quantize(_opts(tmp_path), stages=toy.stages())
    assert [s.describe() for s in plan.stages] == [
        "reused",
        "reused",
        "would run: inputs changed (weights)",
        "would run: head re-runs",
    ]
    assert _snapshot(tmp_path) == before
    (tmp_path / "art.work" / "calibration" / "tokens.bin").write_bytes(b"124")
    before = _snapshot(tmp_path)
    plan = plan_quantize(_opts(tmp_path), stages=toy.stages())
    assert plan.stages[1].describe() == "would run: outputs changed on disk (tokens.bin)"
    assert plan.would_run == ["calibration", "head", "check"] and plan.to_dict()["reused"] == ["source"]
    assert toy.calls == [] and _snapshot(tmp_path) == before


def test_plan_with_force_lists_what_it_would_remove_and_removes_nothing(toy: Toy, tmp_path: Path) -> None:
    (tmp_path / "art").mkdir()
    (tmp_path / "art" / "notes.txt").write_text("mine")
    with pytest.raises(OutFolderError, match="--out .* exists and is not an artifact"):
        plan_quantize(_opts(tmp_path), stages=toy.stages())
    plan = plan_quantize(_opts(tmp_path, force=True), stages=toy.stages())
    assert len(plan.force_removes) == 1 and "notes.txt" in plan.force_removes[0]
    assert (tmp_path / "art" / "notes.txt").read_text() == "mine"


def test_force_removes_nothing_when_the_source_stage_refuses_the_source(toy: Toy, tmp_path: Path) -> None:
    """--force with a source the source stage refuses: --out and --work keep every byte (the removal
    waits for the source stage); with a good source the same run clears both and builds."""
    for name in ("art", "w"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "notes.txt").write_text("mine")
    good = toy.source

    def refused(ctx: StageContext, out: Path) -> dict:
        raise StageError("toy source refused")

    toy.source = refused
    with pytest.raises(StageError, match="toy source refused"):
        pipeline.quantize(_opts(tmp_path, force=True, work=tmp_path / "w"), stages=toy.stages())
    assert (tmp_path / "art" / "notes.txt").read_text() == "mine" and [
        p.name for p in (tmp_path / "art").iterdir()
    ] == ["notes.txt"]
    assert (tmp_path / "w" / "notes.txt").read_text() == "mine"
    toy.source = good
    res = pipeline.quantize(_opts(tmp_path, force=True, work=tmp_path / "w"), stages=toy.stages())
    assert not (tmp_path / "art" / "notes.txt").exists() and not (tmp_path / "w" / "notes.txt").exists()
    assert verify_artifact(tmp_path / "art").root_digest == res.root_digest


@pytest.mark.parametrize("flag", ["out", "work"])
def test_a_file_where_a_folder_is_asked_is_a_usage_error_and_kept(toy: Toy, tmp_path: Path, flag: str) -> None:
    (tmp_path / "f").write_text("mine")
    with pytest.raises(UsageError, match=f"--{flag} .*f is a file, not a folder"):
        pipeline.quantize(_opts(tmp_path, force=True, **{flag: tmp_path / "f"}), stages=toy.stages())
    assert (tmp_path / "f").read_text() == "mine" and toy.calls == []


def test_the_shipped_stage_list() -> None:
    from qwenquant.quantize.stages import PIPELINE

    assert [s.name for s in PIPELINE] == [
        "source",
        "calibration",
        "gptq",
        "lm_head",
        "mtp",
        "textonly",
        "check",
        "eval",
    ]
    assert [s.name for s in PIPELINE if s.builds_checkpoint] == ["gptq", "lm_head", "mtp", "textonly"]
    assert {s.name: s.tasks for s in PIPELINE if s.tasks} == {
        "gptq": ("gptq layers",),
        "lm_head": ("lm_head row chunks",),
    }
    assert [s.name for s in PIPELINE if s.manifest] == ["source", "calibration", "lm_head", "eval"]
