"""The quantize pipeline: `stages.PIPELINE` in order, each with a completion record, resumable.

For each stage (interface: stage.py) the pipeline fingerprints its inputs and params; unless
`<work>/<stage>.record.json` proves the stage complete for exactly those (format and trust rules:
records.py), the stage builds its folder in a staging dir that is renamed to `<work>/<stage>/`.
The last folder that is a full checkpoint becomes the artifact, with its manifest. Only this
module writes stage records and the manifest.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qwenquant.atomic import atomic_write_bytes, pretty_json, staging_dir
from qwenquant.errors import StageError
from qwenquant.hashing import seal
from qwenquant.quantize.records import StageRunner, clean_partials, work_lock
from qwenquant.quantize.stage import Progress, StageContext

if TYPE_CHECKING:
    from qwenquant.recipe import CalibrationSpec, Recipe

log = logging.getLogger(__name__)

QUALITY_FILE = "qwenquant-quality.json"


@dataclass
class QuantizeOptions:
    source_dir: Path
    recipe: Recipe
    calibration: CalibrationSpec
    out: Path
    work: Path | None = None
    device: str | None = None
    source_unverified: bool = False
    force: bool = False
    gpus: int | None = 1  # processes for the gptq stage; None = every visible CUDA GPU


@dataclass
class QuantizeResult:
    artifact: Path
    root_digest: str
    quality: dict[str, Any]
    stages: dict[str, str] = field(default_factory=dict)  # stage -> "ran" | "skipped"
    calibration: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"artifact": str(self.artifact), "root_digest": self.root_digest, "quality": self.quality,
                "stages": self.stages, "calibration_fingerprint": self.calibration.get("fingerprint_sha256")}


def resolve_gpus(gpus: int | None, asked_device: str | None) -> int:
    """How many processes run the gptq stage (`--gpus`; engine/ranks.resolve_ranks)."""
    from qwenquant.quantize.engine.ranks import resolve_ranks

    if asked_device == "cpu":
        return resolve_ranks(gpus, asked_device, 0)
    import torch

    return resolve_ranks(gpus, asked_device, torch.cuda.device_count())


def quantize(opts: QuantizeOptions, progress: Progress | None = None) -> QuantizeResult:
    """Run every stage (resuming from valid records), assemble the artifact, write its manifest."""
    from qwenquant.modeling.runtime import resolve_device
    from qwenquant.quantize.stages import PIPELINE

    source, out, work = _folders(opts)
    device = resolve_device(opts.device)
    ranks = resolve_gpus(opts.gpus, opts.device)
    step = progress or (lambda name, i, n: None)
    total = len(PIPELINE) + 1  # the stages, then the manifest
    fresh_work = not work.exists()
    with work_lock(work):
        clean_partials(work)
        for p in out.parent.glob(f".{out.name}.*.partial"):  # an artifact assembly that was killed
            shutil.rmtree(p, ignore_errors=True)
        runner = StageRunner(work)
        ctx = StageContext(source, opts.recipe, opts.calibration, work, device, opts.source_unverified, progress,
                           runner.outcomes, ranks)
        for i, stage in enumerate(PIPELINE):
            step(stage.name, i, total)
            try:
                runner.run(stage.name, stage.inputs(ctx), stage.params(ctx), lambda d, s=stage: s.run(ctx, d))
            except BaseException:
                if i == 0 and fresh_work:  # a source refused at the first stage leaves no work folder behind
                    shutil.rmtree(work, ignore_errors=True)
                raise
        step("manifest", len(PIPELINE), total)
        built = [ctx.dir(s.name) for s in PIPELINE if s.builds_checkpoint][-1]
        result = _finish(runner, out, built, opts.recipe)
        step("done", total, total)
        return result


def _folders(opts: QuantizeOptions) -> tuple[Path, Path, Path]:
    """(source, out, work), resolved and checked before any folder is created: the source is
    validated, --out and --work hold nothing but this build's files."""
    from qwenquant.quantize.stages.source import validate_source

    source = Path(opts.source_dir).resolve()
    out = Path(opts.out).resolve()
    work = Path(opts.work).resolve() if opts.work else out.with_name(out.name + ".work")
    if out == source or source in out.parents or out in source.parents:
        raise StageError(f"--out {out} overlaps the source folder {source}",
                         hint="write the artifact to its own folder, outside the source")
    validate_source(source, opts.recipe.model, opts.recipe.name)
    guard_folders(out, work, opts.recipe.name, source, force=opts.force)
    return source, out, work


def guard_folders(out: Path, work: Path, recipe_name: str, source: Path, *, force: bool) -> None:
    """Refuse an --out / --work that holds anything but this build's artifact and stage outputs."""
    from qwenquant import outfolder

    outfolder.guard(out, outfolder.foreign_in_artifact_out(out, recipe_name, source), force=force, flag="--out",
                    problem=f"exists and is not an artifact of recipe {recipe_name!r} from {source}")
    outfolder.guard(work, outfolder.foreign_in_work(work), force=force, flag="--work",
                    problem="exists and is not a quantize work folder")


MANIFEST_STAGE_FIELDS = ("stage", "status", "inputs", "outputs", "params", "result")


def manifest_stage(record: dict[str, Any]) -> dict[str, Any]:
    """A stage record as the manifest keeps it: no timestamps (a resumed run writes the same
    manifest bytes as an uninterrupted one), plus a digest of exactly what is kept."""
    kept = {k: record[k] for k in MANIFEST_STAGE_FIELDS}
    return seal(kept, "content_sha256")


def manifest_fields(runner: StageRunner, recipe: Recipe) -> dict[str, Any]:
    """Everything the manifest records besides the file list (source, calibration and quality
    come from the stages of those names)."""
    outcomes = runner.outcomes
    return {
        "source": json.loads((outcomes["source"].dir / "source.json").read_text()),
        "recipe": recipe.canonical(),
        "recipe_sha256": recipe.sha256(),
        "calibration": dict(outcomes["calibration"].result),
        "stages": {name: manifest_stage(o.record) for name, o in outcomes.items()},
        "quality": quality_of(outcomes),
        "tool_versions": runner.versions,
    }


def quality_of(outcomes: dict[str, Any]) -> dict[str, Any]:
    """The manifest's quality section: the lm_head stage's report, plus the quick eval's figures
    when the recipe asked for one (absent otherwise, so such artifacts keep their digests)."""
    quality = dict(outcomes["lm_head"].result)
    quick = outcomes["eval"].result.get("eval") if "eval" in outcomes else None
    if quick is not None:
        quality["eval"] = quick
    return quality


def _finish(runner: StageRunner, out: Path, built: Path, recipe: Recipe) -> QuantizeResult:
    from qwenquant.checkpoint.assemble import link_or_copy
    from qwenquant.manifest import build_manifest, verify_artifact, write_manifest

    fields = manifest_fields(runner, recipe)
    with staging_dir(out) as tmp:
        for p in sorted(built.iterdir()):
            if p.is_file():
                link_or_copy(p, tmp / p.name)
        atomic_write_bytes(tmp / QUALITY_FILE, pretty_json(fields["quality"]))
        manifest = build_manifest(tmp, **fields)
        write_manifest(tmp, manifest)
    report = verify_artifact(out)
    if not report.ok:
        raise StageError(f"the written artifact does not verify: {report.problems}", hint="re-run quantize")
    log.info("artifact %s, root digest %s", out, manifest.root_digest)
    return QuantizeResult(out, manifest.root_digest, fields["quality"],
                          {n: ("ran" if o.ran else "skipped") for n, o in runner.outcomes.items()},
                          runner.outcomes["calibration"].result)


def refresh_manifest(artifact: Path, note: dict[str, Any] | None = None, *, previous: Path | None = None) -> str:
    """Re-hash an artifact after a repair (graft-mtp) keeping what the manifest of `previous` (default:
    the artifact itself) recorded; return the new root digest. Call it on a staging folder before
    it is renamed into place."""
    from qwenquant.manifest import build_manifest, load_manifest, write_manifest

    old = load_manifest(previous or artifact)
    extra = dict(old.extra)
    if note:
        extra.setdefault("repairs", []).append(note)
    m = build_manifest(artifact, source=old.source, recipe=old.recipe, recipe_sha256=old.recipe_sha256,
                       calibration=old.calibration, stages=old.stages, quality=old.quality,
                       tool_versions=old.tool_versions, extra=extra)
    write_manifest(artifact, m)
    return m.root_digest


def _check_headers(folder: Path) -> None:
    """Every safetensors header of `folder` parses and matches its file size (else name the file)."""
    from qwenquant.checkpoint.header import SafetensorsError, read_header

    for p in sorted(folder.glob("*.safetensors")):
        try:
            read_header(p)
        except SafetensorsError as e:
            raise StageError(f"{p}: {e}", hint="the file is damaged or truncated; copy or rebuild it") from None


def graft_keeps(artifact: Path) -> set[str]:
    """Top-level names of an artifact that graft-mtp carries into the folder it rebuilds."""
    from qwenquant.manifest import MANIFEST_NAME

    manifest = artifact / MANIFEST_NAME
    if manifest.is_file():
        try:
            return {str(f["path"]).split("/")[0] for f in json.loads(manifest.read_text())["files"]} | {MANIFEST_NAME}
        except (ValueError, KeyError, TypeError):
            return {p.name for p in artifact.iterdir()}  # a broken manifest is reported by verify below
    try:
        shards = set(json.loads((artifact / "model.safetensors.index.json").read_text())["weight_map"].values())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        shards = set()
    return shards | {p.name for p in artifact.iterdir() if p.is_file() and not p.is_symlink()
                     and not p.name.startswith(".") and p.suffix != ".safetensors"}


def graft_mtp(artifact: Path, source: Path, *, check_only: bool = False, force: bool = False) -> dict[str, Any]:
    """`qwenquant graft-mtp`: put the source MTP tensors back into an artifact (idempotent)."""
    from qwenquant.manifest import MANIFEST_NAME, verify_artifact
    from qwenquant.checkpoint.assemble import carry_files
    from qwenquant.quantize.stages.mtp import graft_into, plan_for, verify_mtp

    artifact, source = Path(artifact).resolve(), Path(source).resolve()
    for p, what in ((artifact, "artifact"), (source, "source")):
        if not (p / "config.json").is_file():
            raise StageError(f"{what} folder {p} has no config.json", hint=f"check the {what} path")
    if not check_only:
        from qwenquant import outfolder

        foreign = outfolder.foreign_in_graft_target(artifact, graft_keeps(artifact))
        outfolder.guard(artifact, foreign, force=force, flag="artifact", remove=foreign,
                        problem="holds entries that are not part of the artifact (graft-mtp rebuilds the folder "
                                "and would drop them)")
    for folder in (artifact, source):
        _check_headers(folder)
    plan = plan_for(artifact, source)
    if check_only or plan.nothing_to_do:
        return {"artifact": str(artifact), "plan": plan.summary(), "nothing_to_do": plan.nothing_to_do,
                "written": False}
    had_manifest = (artifact / MANIFEST_NAME).is_file()
    if had_manifest:
        # Re-hashing blesses whatever is on disk: only the files a graft repairs may differ.
        from qwenquant.errors import VerificationError

        before = verify_artifact(artifact)
        others = [f for f in before.bad_files if f not in ("model.safetensors.index.json", "config.json")
                  and "mtp" not in f]
        if others:
            raise VerificationError(
                f"{artifact}: files besides the MTP shard, index and config differ from the manifest: "
                + ", ".join(others[:5]), hint="graft-mtp repairs only the MTP head; re-run `qwenquant quantize`")
    with staging_dir(artifact) as tmp:
        graft_into(artifact, tmp, source, plan)
        carry_files(artifact, tmp, drop=[MANIFEST_NAME])
        root = refresh_manifest(tmp, {"graft_mtp": plan.summary()}, previous=artifact) if had_manifest else None
    problems = verify_mtp(artifact, source)
    if had_manifest:
        report = verify_artifact(artifact)
        if not report.ok:
            problems += [str(p) for p in report.problems]
    if problems:
        raise StageError("graft-mtp: the artifact still fails: " + "; ".join(problems), hint="re-run graft-mtp")
    return {"artifact": str(artifact), "plan": plan.summary(), "nothing_to_do": False, "written": True,
            "root_digest": root}
