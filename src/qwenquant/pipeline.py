"""The quantize pipeline: stages in order, each with a completion record, resumable after a crash.

Each stage builds its output folder in a staging dir and renames it to `<work>/<stage>/`, then
writes `<work>/<stage>.record.json` (format and trust rules: stages/records.py). A re-run skips a
stage only when its record proves it complete; anything else runs it again from its start. Only
this module writes stage records and the manifest.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qwenquant.atomic import atomic_write_bytes, atomic_write_json, pretty_json, staging_dir
from qwenquant.errors import CheckError, StageError
from qwenquant.hashing import sha256_file
from qwenquant.stages.records import StageOutcome, StageRunner, clean_partials, sha256_json, work_lock

log = logging.getLogger(__name__)

from qwenquant.stages import STAGES  # noqa: E402  (the stage order, in one place)
QUALITY_FILE = "qwenquant-quality.json"

@dataclass
class QuantizeOptions:
    source_dir: Path
    recipe: Any
    calibration: Any
    out: Path
    work: Path | None = None
    device: str | None = None
    source_unverified: bool = False
    force: bool = False


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


def resolve_device(device: str | None) -> str:
    """cuda when present (or asked for), else cpu."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise StageError("--device cuda but no CUDA device is visible", hint="drop --device, or use --device cpu")
    return device or ("cuda" if torch.cuda.is_available() else "cpu")


def quantize(opts: QuantizeOptions, progress: Callable[[str, int, int], None] | None = None) -> QuantizeResult:
    """Run every stage (resuming from valid records), assemble the artifact, write its manifest."""
    from qwenquant.stages import calibration as cal

    recipe, spec = opts.recipe, opts.calibration
    source, out, work = _folders(opts)
    device = resolve_device(opts.device)
    step = progress or (lambda name, i, n: None)
    fresh_work = not work.exists()
    with work_lock(work):
        clean_partials(work)
        for p in out.parent.glob(f".{out.name}.*.partial"):  # an artifact assembly that was killed
            shutil.rmtree(p, ignore_errors=True)
        runner = StageRunner(work)
        total = len(STAGES) + 1

        step("source", 0, total)
        try:
            src = _run_source(runner, source, recipe, opts.source_unverified)
        except BaseException:
            if fresh_work:  # a source refused at the first stage leaves no work folder behind
                shutil.rmtree(work, ignore_errors=True)
            raise

        step("calibration", 1, total)
        spec_dump = spec.model_dump(mode="json")
        data = spec.resolved_path() if spec.source == "local" else None
        calib = runner.run(
            "calibration",
            {"source": src.digest, "spec": sha256_json(spec_dump),
             "data": sha256_file(data) if data is not None and data.is_file() else f"hub:{spec.dataset}@{spec.revision}"},
            {"spec": spec_dump},
            lambda d: cal.run_calibration(spec, source, d, datasets_dir=work / "datasets"))
        samples = None

        def tokens() -> list[list[int]]:
            nonlocal samples
            if samples is None:
                samples = cal.load_tokens(calib.dir)
            return samples

        step("gptq", 2, total)
        q_dump = recipe.quantization.model_dump(mode="json")
        a_dump = recipe.artifact.model_dump(mode="json")
        gptq = runner.run(
            "gptq",
            {"source": src.digest, "calibration": calib.digest, "quantization": sha256_json(q_dump),
             "artifact": sha256_json(a_dump), "device": device},
            {"quantization": q_dump, "device": device},
            lambda d: _gptq_stage(d, source, tokens(), recipe, device, progress))

        step("lm_head", 3, total)
        h_dump = recipe.lm_head.model_dump(mode="json")
        head = runner.run(
            "lm_head",
            {"source": src.digest, "calibration": calib.digest, "gptq": gptq.digest, "lm_head": sha256_json(h_dump),
             "device": device},
            {"lm_head": h_dump, "device": device},
            lambda d: _head_stage(d, source, tokens(), recipe, gptq.dir, device, progress))

        step("mtp", 4, total)
        mtp = runner.run("mtp", {"source": src.digest, "lm_head": head.digest}, {},
                         lambda d: _mtp_stage(d, head.dir, source))

        step("textonly", 5, total)
        layout = recipe.artifact.layout
        text = runner.run("textonly", {"mtp": mtp.digest, "layout": sha256_json(layout)}, {"layout": layout},
                          lambda d: _layout_stage(d, mtp.dir, layout))

        step("check", 6, total)
        check = runner.run(
            "check", {"textonly": text.digest, "source": src.digest, "recipe": recipe.sha256()}, {"layout": layout},
            lambda d: _check_stage(d, text.dir, source, recipe))

        step("manifest", 7, total)
        result = _finish(runner, out, text.dir, src, calib, head, check, recipe)
        step("done", total, total)
        return result


def _folders(opts: QuantizeOptions) -> tuple[Path, Path, Path]:
    """(source, out, work), resolved and checked before any folder is created: the source is
    validated, --out and --work hold nothing but this build's files."""
    from qwenquant.stages.source import validate_source

    source = Path(opts.source_dir).resolve()
    out = Path(opts.out).resolve()
    work = Path(opts.work).resolve() if opts.work else out.with_name(out.name + ".work")
    if out == source or source in out.parents or out in source.parents:
        raise StageError(f"--out {out} overlaps the source folder {source}",
                         hint="write the artifact to its own folder, outside the source")
    validate_source(source, opts.recipe)
    guard_folders(out, work, opts.recipe.name, source, force=opts.force)
    return source, out, work


def _run_source(runner: StageRunner, source: Path, recipe: Any, unverified: bool) -> StageOutcome:
    from qwenquant.stages.source import stat_fingerprint

    record_file = source / "qwenquant-fetch.json"
    return runner.run(
        "source",
        {"stat": stat_fingerprint(source), "fetch_record": sha256_file(record_file) if record_file.is_file() else "none"},
        {"unverified": unverified, "path": str(source)},
        lambda d: _source_stage(d, source, recipe, unverified))


def guard_folders(out: Path, work: Path, recipe_name: str, source: Path, *, force: bool) -> None:
    """Refuse an --out / --work that holds anything but this build's artifact and stage outputs."""
    from qwenquant import outfolder

    outfolder.guard(out, outfolder.foreign_in_artifact_out(out, recipe_name, source), force=force, flag="--out",
                    problem=f"exists and is not an artifact of recipe {recipe_name!r} from {source}")
    outfolder.guard(work, outfolder.foreign_in_work(work), force=force, flag="--work",
                    problem="exists and is not a quantize work folder")


def _source_stage(d: Path, source: Path, recipe: Any, unverified: bool) -> dict[str, Any]:
    from qwenquant.stages.source import describe_source

    desc = describe_source(source, recipe, unverified=unverified)
    atomic_write_json(d / "source.json", desc)
    return {k: v for k, v in desc.items() if k != "files"} | {"file_count": len(desc["files"])}


def _gptq_stage(d: Path, source: Path, samples: list[list[int]], recipe: Any, device: str,
                progress: Callable[[str, int, int], None] | None) -> dict[str, Any]:
    from qwenquant.stages.gptq import run_gptq

    cb = (lambda i, n: progress("gptq layers", i, n)) if progress else None
    return run_gptq(source, samples, recipe, d, device=device, progress=cb)


def _head_stage(d: Path, source: Path, samples: list[list[int]], recipe: Any, prev: Path, device: str,
                progress: Callable[[str, int, int], None] | None) -> dict[str, Any]:
    from qwenquant.stages.assemble import current_plan, derive_checkpoint, read_config

    if not recipe.lm_head.enabled:
        derive_checkpoint(prev, d, current_plan(prev), read_config(prev))
        return {"lm_head": {"method": "none"}}
    from qwenquant.stages.headquant import run_head

    cb = (lambda i, n: progress("lm_head row chunks", i, n)) if progress else None
    return run_head(source, samples, recipe, prev, d, device=device, progress=cb)


def _mtp_stage(d: Path, prev: Path, source: Path) -> dict[str, Any]:
    from qwenquant.stages.assemble import carry_files
    from qwenquant.stages.mtp import graft_into, plan_for

    plan = plan_for(prev, source)
    graft_into(prev, d, source, plan)
    carry_files(prev, d)
    return {"graft": plan.summary(), "added": len(plan.add)}


def _layout_stage(d: Path, prev: Path, layout: str) -> dict[str, Any]:
    from qwenquant.stages.textonly import keep_multimodal, rewrite_text_only

    return rewrite_text_only(prev, d) if layout == "text-only" else keep_multimodal(prev, d)


def unquantized_problems(artifact: Path, source: Path, recipe: Any, layout: str) -> list[str]:
    """The byte-identity proof for a finished artifact (text-only names mapped back to the source)."""
    from qwenquant.stages.identity import prove_unquantized_identical, recipe_quantizes
    from qwenquant.stages.textonly import text_only_name

    return prove_unquantized_identical(
        artifact, source, rename=text_only_name if layout == "text-only" else (lambda n: n),
        may_quantize=recipe_quantizes(list(recipe.quantization.ignore), head_quantized=recipe.lm_head.enabled))


def _check_stage(d: Path, artifact: Path, source: Path, recipe: Any) -> dict[str, Any]:
    from qwenquant.stages.mtp import verify_mtp

    layout = recipe.artifact.layout
    problems = [f"unquantized-identical: {p}" for p in unquantized_problems(artifact, source, recipe, layout)]
    problems += [f"mtp-identical: {p}" for p in verify_mtp(artifact, source)]
    from qwenquant.check import check_artifact

    report = check_artifact(artifact)
    rules_run = list(report.rules_run)
    rules: list[str] = []
    for p in report.findings:
        problems.append(str(p))
        rules.append(p.rule)
    atomic_write_json(d / "check.json", {"problems": problems, "failed_rules": sorted(set(rules)),
                                         "rules_run": rules_run + ["unquantized-identical", "mtp-identical"]})
    if problems:
        ids = sorted(set(rules) | {p.split(":", 1)[0] for p in problems if p.startswith(("unquantized-", "mtp-"))})
        raise CheckError(f"the artifact fails {len(problems)} check(s) [{', '.join(ids)}]:\n  " + "\n  ".join(problems[:20]),
                         hint="fix the cause and re-run `qwenquant quantize` (finished stages are reused)")
    return {"problems": 0}


MANIFEST_STAGE_FIELDS = ("stage", "status", "inputs", "outputs", "params", "result")


def manifest_stage(record: dict[str, Any]) -> dict[str, Any]:
    """A stage record as the manifest keeps it: no timestamps (a resumed run writes the same
    manifest bytes as an uninterrupted one), plus a digest of exactly what is kept."""
    kept = {k: record[k] for k in MANIFEST_STAGE_FIELDS}
    return {**kept, "content_sha256": sha256_json(kept)}


def manifest_fields(src: StageOutcome, calib: StageOutcome, head: StageOutcome, runner: StageRunner,
                    recipe: Any) -> dict[str, Any]:
    """Everything the manifest records besides the file list."""
    source_desc = json.loads((src.dir / "source.json").read_text())
    return {
        "source": source_desc,
        "recipe": recipe.canonical(),
        "recipe_sha256": recipe.sha256(),
        "calibration": {k: v for k, v in calib.result.items()},
        "stages": {name: manifest_stage(o.record) for name, o in runner.outcomes.items()},
        "quality": head.result,
        "tool_versions": runner.versions,
    }


def _finish(runner: StageRunner, out: Path, built: Path, src: StageOutcome, calib: StageOutcome,
            head: StageOutcome, check: StageOutcome, recipe: Any) -> QuantizeResult:
    from qwenquant.manifest import build_manifest, verify_artifact, write_manifest
    from qwenquant.stages.assemble import link_or_copy

    fields = manifest_fields(src, calib, head, runner, recipe)
    with staging_dir(out) as tmp:
        for p in sorted(built.iterdir()):
            if p.is_file():
                link_or_copy(p, tmp / p.name)
        atomic_write_bytes(tmp / QUALITY_FILE, pretty_json(head.result))
        manifest = build_manifest(tmp, **fields)
        write_manifest(tmp, manifest)
    report = verify_artifact(out)
    if not report.ok:
        raise StageError(f"the written artifact does not verify: {report.problems}", hint="re-run quantize")
    log.info("artifact %s, root digest %s", out, manifest.root_digest)
    return QuantizeResult(out, manifest.root_digest, head.result,
                          {n: ("ran" if o.ran else "skipped") for n, o in runner.outcomes.items()}, calib.result)


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
    from qwenquant.safetensors_check import SafetensorsError, read_header

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
    from qwenquant.stages.assemble import carry_files
    from qwenquant.stages.mtp import graft_into, plan_for, verify_mtp

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
