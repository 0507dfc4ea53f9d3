"""pipeline.quantize itself, driven with small in-test stages (no torch, no model): the order and
progress come from the stage list, records make a re-run skip, the artifact is the last checkpoint
stage's folder plus the manifest, and a failing stage leaves nothing behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qwenquant.quantize import pipeline
from qwenquant.atomic import atomic_write_json
from qwenquant.errors import StageError
from qwenquant.manifest import MANIFEST_NAME, verify_artifact
from qwenquant.recipe import load_recipe
from qwenquant.quantize.stage import Stage, StageContext


class Toy:
    """Four stages with the names the manifest reads (source, calibration, lm_head) and a check."""

    def __init__(self) -> None:
        self.weights = b"weights-1"
        self.calls: list[str] = []
        self.fail_check = False

    def _ran(self, name: str) -> None:
        self.calls.append(name)

    def source(self, ctx: StageContext, out: Path) -> dict:
        self._ran("source")
        atomic_write_json(out / "source.json", {"kind": "local-unverified", "files": {}})
        return {"kind": "local-unverified"}

    def calibration(self, ctx: StageContext, out: Path) -> dict:
        self._ran("calibration")
        (out / "tokens.bin").write_bytes(b"123")
        return {"fingerprint_sha256": "f" * 64}

    def lm_head(self, ctx: StageContext, out: Path) -> dict:
        self._ran("lm_head")
        (out / "config.json").write_text("{}")
        (out / "model.safetensors").write_bytes(self.weights)
        return {"lm_head": {"method": "toy"}}

    def check(self, ctx: StageContext, out: Path) -> dict:
        self._ran("check")
        if self.fail_check:
            raise StageError("toy check failed")
        return {"problems": 0}

    def pipeline(self) -> tuple[Stage, ...]:
        return (
            Stage("source", lambda ctx: {"path": str(ctx.source)}, lambda ctx: {}, self.source),
            Stage("calibration", lambda ctx: {"source": ctx.digest("source")}, lambda ctx: {}, self.calibration),
            Stage("lm_head", lambda ctx: {"calibration": ctx.digest("calibration"), "weights": self.weights.decode()},
                  lambda ctx: {"device": ctx.device}, self.lm_head, builds_checkpoint=True),
            Stage("check", lambda ctx: {"lm_head": ctx.digest("lm_head")}, lambda ctx: {}, self.check),
        )


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> Toy:
    import qwenquant.quantize.stages
    import qwenquant.quantize.stages.source

    t = Toy()
    monkeypatch.setattr(qwenquant.quantize.stages, "PIPELINE", t.pipeline())
    monkeypatch.setattr(qwenquant.quantize.stages.source, "validate_source", lambda *a: None)  # the toy source has no weights
    return t


def _quantize(tmp_path: Path, progress=None) -> pipeline.QuantizeResult:
    recipe = load_recipe("w4a16-int4head")
    (tmp_path / "src").mkdir(exist_ok=True)
    opts = pipeline.QuantizeOptions(tmp_path / "src", recipe, recipe.calibration, tmp_path / "art", device="cpu")
    return pipeline.quantize(opts, progress)


def test_stages_run_in_list_order_with_progress_numbers_from_the_list(toy: Toy, tmp_path: Path) -> None:
    steps: list[tuple[str, int, int]] = []
    res = _quantize(tmp_path, lambda name, i, n: steps.append((name, i, n)))
    assert toy.calls == ["source", "calibration", "lm_head", "check"]
    assert steps == [("source", 0, 5), ("calibration", 1, 5), ("lm_head", 2, 5), ("check", 3, 5),
                     ("manifest", 4, 5), ("done", 5, 5)]
    assert res.stages == {"source": "ran", "calibration": "ran", "lm_head": "ran", "check": "ran"}
    art = tmp_path / "art"
    assert sorted(p.name for p in art.iterdir()) == ["config.json", "model.safetensors", MANIFEST_NAME,
                                                      pipeline.QUALITY_FILE]
    assert (art / "model.safetensors").read_bytes() == b"weights-1"
    assert verify_artifact(art).ok and res.root_digest == verify_artifact(art).root_digest
    manifest = json.loads((art / MANIFEST_NAME).read_text())
    assert manifest["quality"] == {"lm_head": {"method": "toy"}}
    assert manifest["calibration"] == {"fingerprint_sha256": "f" * 64}
    assert list(manifest["stages"]) == ["calibration", "check", "lm_head", "source"]  # canonical JSON sorts
    assert manifest["stages"]["lm_head"]["params"] == {"device": "cpu"}
    assert all((tmp_path / "art.work" / f"{n}.record.json").is_file() for n in res.stages)


def test_rerun_skips_every_stage_and_writes_the_same_manifest(toy: Toy, tmp_path: Path) -> None:
    first = _quantize(tmp_path)
    manifest = (tmp_path / "art" / MANIFEST_NAME).read_bytes()
    toy.calls.clear()
    again = _quantize(tmp_path)
    assert toy.calls == [] and set(again.stages.values()) == {"skipped"}
    assert again.root_digest == first.root_digest
    assert (tmp_path / "art" / MANIFEST_NAME).read_bytes() == manifest


def test_changed_input_reruns_that_stage_and_those_reading_its_outputs(toy: Toy, tmp_path: Path) -> None:
    first = _quantize(tmp_path)
    toy.calls.clear()
    toy.weights = b"weights-2"
    again = _quantize(tmp_path)
    assert toy.calls == ["lm_head", "check"]
    assert again.stages == {"source": "skipped", "calibration": "skipped", "lm_head": "ran", "check": "ran"}
    assert again.root_digest != first.root_digest
    assert (tmp_path / "art" / "model.safetensors").read_bytes() == b"weights-2"


def test_failing_stage_leaves_no_record_and_no_artifact(toy: Toy, tmp_path: Path) -> None:
    toy.fail_check = True
    with pytest.raises(StageError, match="toy check failed"):
        _quantize(tmp_path)
    work = tmp_path / "art.work"
    assert not (tmp_path / "art").exists() and not (work / "check.record.json").exists()
    assert (work / "lm_head.record.json").is_file()
    assert not list(work.glob(".*.partial")) and not list(tmp_path.glob(".art.*"))


def test_out_inside_the_source_is_refused(toy: Toy, tmp_path: Path) -> None:
    recipe = load_recipe("w4a16-int4head")
    (tmp_path / "src").mkdir()
    opts = pipeline.QuantizeOptions(tmp_path / "src", recipe, recipe.calibration, tmp_path / "src" / "art")
    with pytest.raises(StageError, match="overlaps the source folder"):
        pipeline.quantize(opts)
    assert toy.calls == []


def test_the_shipped_stage_list() -> None:
    from qwenquant.quantize.stages import PIPELINE

    assert [s.name for s in PIPELINE] == ["source", "calibration", "gptq", "lm_head", "mtp", "textonly", "check",
                                        "eval"]
    assert [s.name for s in PIPELINE if s.builds_checkpoint] == ["gptq", "lm_head", "mtp", "textonly"]
