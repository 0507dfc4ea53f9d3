"""The quantize pipeline: a stage list (default `stages.PIPELINE`) in order, each with a completion
record, resumable.

For each stage (interface: stage.py) the pipeline fingerprints its inputs and params; unless
`<work>/<stage>.record.json` proves the stage complete for exactly those (format and trust rules:
records.py), the stage builds its folder in a staging dir that is renamed to `<work>/<stage>/`.
The last folder that is a full checkpoint becomes the artifact, with its manifest, whose source,
calibration and quality sections are what the stages contribute (`Stage.manifest`). Only this
module writes stage records and the manifest. `quantize --plan` (status.py) uses the same
options, folder checks and context without running or writing anything.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qwenquant.atomic import atomic_write_bytes, pretty_json, staging_dir
from qwenquant.errors import StageError
from qwenquant.hashing import seal
from qwenquant.quantize.records import StageRunner, clean_partials, work_lock
from qwenquant.quantize.stage import Progress, Stage, StageContext
from qwenquant.quantize.timings import Timings

if TYPE_CHECKING:
    from qwenquant.outfolder import Removal
    from qwenquant.recipe import CalibrationSpec, Recipe

log = logging.getLogger(__name__)

QUALITY_FILE = "qwenquant-quality.json"
MANIFEST_PARTS = ("source", "calibration", "quality")  # the manifest fields stages contribute


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
    timings: Timings = field(default_factory=Timings)  # what this run measured of itself (timings.py)

    def to_dict(self) -> dict[str, Any]:
        return {
            "artifact": str(self.artifact),
            "root_digest": self.root_digest,
            "quality": self.quality,
            "stages": self.stages,
            "calibration_fingerprint": self.calibration.get("fingerprint_sha256"),
            "timings": self.timings.to_dict(),
        }


def stage_list(stages: Sequence[Stage] | None) -> tuple[Stage, ...]:
    """`stages`, or the shipped pipeline when None."""
    if stages is not None:
        return tuple(stages)
    from qwenquant.quantize.stages import PIPELINE

    return PIPELINE


def resolve_gpus(gpus: int | None, asked_device: str | None) -> int:
    """How many processes run the gptq stage (`--gpus`; engine/ranks.resolve_ranks)."""
    from qwenquant.quantize.engine.ranks import resolve_ranks

    if asked_device == "cpu":
        return resolve_ranks(gpus, asked_device, 0)
    import torch

    return resolve_ranks(gpus, asked_device, torch.cuda.device_count())


def new_context(opts: QuantizeOptions, source: Path, work: Path, progress: Progress | None = None) -> StageContext:
    """The context every stage of this run reads (device and process count resolved)."""
    from qwenquant.modeling.runtime import resolve_device

    return StageContext(
        source,
        opts.recipe,
        opts.calibration,
        work,
        resolve_device(opts.device),
        opts.source_unverified,
        progress,
        {},
        resolve_gpus(opts.gpus, opts.device),
    )


def quantize(
    opts: QuantizeOptions, progress: Progress | None = None, *, stages: Sequence[Stage] | None = None
) -> QuantizeResult:
    """Run every stage (resuming from valid records), assemble the artifact, write its manifest."""
    stages = stage_list(stages)
    source, out, work, removals = check_folders(opts, stages)
    from qwenquant.quantize.space import check_free_space, check_writable, disk_error

    check_writable(out, work)
    check_free_space(
        source, out, work, opts.recipe, [s.name for s in stages if not (work / f"{s.name}.record.json").is_file()]
    )
    ctx = new_context(opts, source, work, progress)
    step = progress or (lambda stage, task, i, n: None)
    total = len(stages) + 1  # the stages, then the manifest
    fresh_work = not work.exists()
    with work_lock(work):
        clean_partials(work)
        for p in out.parent.glob(f".{out.name}.*.partial"):  # an artifact assembly that was killed
            shutil.rmtree(p, ignore_errors=True)
        runner = StageRunner(work)
        ctx.outcomes = runner.outcomes
        ctx.digests = runner.digests
        for i, stage in enumerate(stages):
            step(stage.name, None, i, total)
            ctx.current = stage
            try:
                _run_timed(runner, stage, ctx)
                if i == 0:  # the source passed: --force may now clear what is not this build's in --work
                    for r in removals:
                        if r.flag == "--work":
                            r.apply()
            except OSError as e:
                err = disk_error(e, stage.name)
                if err is None:
                    raise
                raise err from e
            except BaseException:
                if i == 0 and fresh_work:  # a source refused at the first stage leaves no work folder behind
                    shutil.rmtree(work, ignore_errors=True)
                raise
        ctx.current = None
        step("manifest", None, len(stages), total)
        built = [ctx.dir(s.name) for s in stages if s.builds_checkpoint][-1]
        for r in removals:
            if r.flag == "--out":  # the verified new artifact replaces it whole (_finish's staging_dir)
                log.warning("--force: removing %s (the new artifact takes its place)", r.said)
        result = _finish(runner, stages, out, built, opts.recipe)
        result.timings = ctx.timings
        step("done", None, total, total)
        return result


def check_folders(
    opts: QuantizeOptions, stages: Sequence[Stage], *, dry_run: bool = False
) -> tuple[Path, Path, Path, list[Removal]]:
    """(source, out, work, what --force removes), resolved and checked before any folder is
    created: each stage's preflight passes, --out / --work hold nothing but this build's files
    (else OutFolderError; with --force, the removals quantize applies once the source stage passed:
    --work's foreign entries then, --out when the new artifact replaces it)."""
    source = Path(opts.source_dir).resolve()
    out = Path(opts.out).resolve()
    work = Path(opts.work).resolve() if opts.work else out.with_name(out.name + ".work")
    refuse_harmful_folders(source, out, work)
    for stage in stages:
        if stage.preflight is not None:
            stage.preflight(source, opts.recipe)
    removes = guard_folders(out, work, opts.recipe.name, source, force=opts.force, dry_run=dry_run)
    return source, out, work, removes


def refuse_harmful_folders(source: Path, out: Path, work: Path) -> None:
    """UsageError (exit 2) for an --out / --work that would change other data: the source, another
    artifact (its manifest would stop verifying), or each other."""
    from qwenquant.errors import UsageError
    from qwenquant.manifest import MANIFEST_NAME

    for folder, flag in ((out, "--out"), (work, "--work")):
        if folder == source or source in folder.parents or folder in source.parents:
            raise UsageError(
                f"{flag} {folder} overlaps the source folder {source}",
                hint=f"pass a {flag} outside the source (quantize never writes into it)",
            )
        inside = next((p for p in folder.parents if (p / MANIFEST_NAME).is_file()), None)
        if inside is not None:
            raise UsageError(
                f"{flag} {folder} is inside the artifact {inside}, which would no longer verify",
                hint=f"pass a {flag} outside every artifact folder",
            )
    if work == out or out in work.parents or work in out.parents:
        raise UsageError(
            f"--work {work} overlaps --out {out}",
            hint="leave --work out (default: OUT.work beside the artifact) or pass a separate folder",
        )


def guard_folders(
    out: Path, work: Path, recipe_name: str, source: Path, *, force: bool, dry_run: bool = False
) -> list[Removal]:
    """Refuse an --out / --work that holds anything but this build's artifact and stage outputs (a file
    for either: exit 2); with `force`, what quantize removes once the source passed (nothing now)."""
    from qwenquant import outfolder

    outfolder.refuse_a_file(out, "--out")
    outfolder.refuse_a_file(work, "--work")
    checks = (
        (
            out,
            lambda: outfolder.foreign_in_artifact_out(out, recipe_name, source),
            "--out",
            f"exists and is not an artifact of recipe {recipe_name!r} from {source}",
            None,
        ),
        (
            work,
            lambda: outfolder.foreign_in_work(work),
            "--work",
            "exists and is not a quantize work folder",
            "foreign",
        ),
    )
    removals = []
    for folder, find, flag, problem, remove in checks:
        foreign = find()
        r = outfolder.guard(
            folder, foreign, force=force, flag=flag, problem=problem, remove=foreign if remove else None
        )
        if r is not None:
            removals.append(r)
    return removals


MANIFEST_STAGE_FIELDS = ("stage", "status", "inputs", "outputs", "params", "result")


def manifest_stage(record: dict[str, Any]) -> dict[str, Any]:
    """A stage record as the manifest keeps it: no timestamps (a resumed run writes the same
    manifest bytes as an uninterrupted one), plus a digest of exactly what is kept."""
    kept = {k: record[k] for k in MANIFEST_STAGE_FIELDS}
    return seal(kept, "content_sha256")


def manifest_fields(runner: StageRunner, stages: Sequence[Stage], recipe: Recipe) -> dict[str, Any]:
    """Everything the manifest records besides the file list: the recipe, every stage's record,
    the tool versions, and the parts the stages contribute (`Stage.manifest`; none: empty)."""
    parts: dict[str, dict[str, Any]] = {k: {} for k in MANIFEST_PARTS}
    for stage in stages:
        for key, value in (stage.manifest(runner.outcomes[stage.name]) if stage.manifest else {}).items():
            if key not in parts:
                raise ValueError(f"stage {stage.name} adds {key!r} to the manifest; stages add {MANIFEST_PARTS}")
            if (key != "quality" and parts[key]) or set(parts[key]) & set(value):
                raise ValueError(f"stage {stage.name} adds {key!r} to the manifest again ({sorted(value)})")
            parts[key].update(value)
    return {
        **parts,
        "recipe": recipe.canonical(),
        "recipe_sha256": recipe.sha256(),
        "stages": {name: manifest_stage(o.record) for name, o in runner.outcomes.items()},
        "tool_versions": runner.versions,
    }


def _status(stage: Stage, outcome: Any) -> str:
    """How `quantize --json` reports a stage: ran, skipped (its record proved it complete) or not asked."""
    if stage.idle is not None and stage.idle(outcome.result):
        return "not asked"
    return "ran" if outcome.ran else "skipped"


def _run_timed(runner: StageRunner, stage: Stage, ctx: StageContext) -> None:
    """Run one stage through its record; its wall seconds go to `ctx.timings` when it ran (not reused)."""
    t0, ran = time.perf_counter(), []

    def run(staging: Path) -> dict[str, Any]:
        ran.append(stage.name)
        return stage.run(ctx, staging)

    runner.run(stage.name, stage.inputs(ctx), stage.params(ctx), run)
    if ran:
        ctx.timings.stages[stage.name] = time.perf_counter() - t0


def _finish(runner: StageRunner, stages: Sequence[Stage], out: Path, built: Path, recipe: Recipe) -> QuantizeResult:
    from qwenquant.checkpoint.assemble import link_or_copy
    from qwenquant.manifest import build_manifest, verify_artifact, write_manifest

    fields = manifest_fields(runner, stages, recipe)
    with staging_dir(out) as tmp:
        for p in sorted(built.iterdir()):
            if p.is_file():
                link_or_copy(p, tmp / p.name)
        atomic_write_bytes(tmp / QUALITY_FILE, pretty_json(fields["quality"]))
        # hard links of the built stage's files: their digests were taken for its record in this
        # run (same inode, size and mtime); only new files are read. verify_artifact re-reads all.
        manifest = build_manifest(tmp, **fields, hasher=runner.digests.files)
        write_manifest(tmp, manifest)
    report = verify_artifact(out)
    if not report.ok:
        raise StageError(f"the written artifact does not verify: {report.problems}", hint="re-run quantize")
    log.info("artifact %s, root digest %s", out, manifest.root_digest)
    return QuantizeResult(
        out,
        manifest.root_digest,
        fields["quality"],
        {s.name: _status(s, runner.outcomes[s.name]) for s in stages},
        fields["calibration"],
    )
