"""`qwenquant graft-mtp`: put the source's bf16 MTP tensors back into an artifact, beside the mtp stage.

The plan, the graft and the MTP proof are the mtp stage's own functions (stages/mtp.py); this
module adds what the command needs around them: the folder checks, the rebuild of the artifact in
a staging folder, and the manifest refreshed to the new bytes (`refresh_manifest`).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qwenquant.atomic import staging_dir
from qwenquant.errors import StageError, UsageError

if TYPE_CHECKING:
    from qwenquant.outfolder import Removal

log = logging.getLogger(__name__)


def refresh_manifest(artifact: Path, note: dict[str, Any] | None = None, *, previous: Path | None = None) -> str:
    """Re-hash an artifact after a repair (graft-mtp) keeping what the manifest of `previous` (default:
    the artifact itself) recorded; return the new root digest. Call it on a staging folder before
    it is renamed into place."""
    from qwenquant.manifest import build_manifest, load_manifest, write_manifest

    old = load_manifest(previous or artifact)
    extra = dict(old.extra)
    if note:
        extra.setdefault("repairs", []).append(note)
    m = build_manifest(
        artifact,
        source=old.source,
        recipe=old.recipe,
        recipe_sha256=old.recipe_sha256,
        calibration=old.calibration,
        stages=old.stages,
        quality=old.quality,
        tool_versions=old.tool_versions,
        extra=extra,
    )
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


def _recorded_commit(source: Path) -> str | None:
    try:
        return json.loads((source / "qwenquant-fetch.json").read_text()).get("commit")
    except (OSError, ValueError, AttributeError):
        return None


def prove_source(artifact: Path, source: Path) -> str | None:
    """Raise VerificationError unless `source` is the checkpoint the artifact's manifest records:
    same fetched commit (when both name one), and config.json plus every shard holding mtp.*
    tensors hash to the manifest's record. Return a warning when the manifest records no source."""
    from qwenquant.checkpoint.assemble import weight_map
    from qwenquant.errors import VerificationError
    from qwenquant.hashing import sha256_file
    from qwenquant.manifest import MANIFEST_NAME, load_manifest

    if not (artifact / MANIFEST_NAME).is_file():
        return f"{artifact} has no manifest: --source is checked against config.json's shapes only"
    recorded = load_manifest(artifact).source
    files = recorded.get("files") or {}
    if not files:
        return "the artifact's manifest records no source files: --source is checked against config.json's shapes only"
    what = recorded.get("repo") or "a local folder"
    if recorded.get("commit"):
        what += f" at commit {recorded['commit']}"
    hint = f"pass the folder this artifact was quantized from ({what}), e.g. the `qwenquant fetch` output"
    commit = _recorded_commit(source)
    if commit and recorded.get("commit") and commit != recorded["commit"]:
        raise VerificationError(
            f"--source {source} is commit {commit}, but {artifact} was quantized from {what}", hint=hint
        )
    read = ["config.json"] + sorted({s for n, s in weight_map(source).items() if n.startswith("mtp.")})
    for rel in read:
        want = (files.get(rel) or {}).get("sha256")
        if want is None:
            raise VerificationError(
                f"--source {source}: {rel} is not a file of this artifact's source ({what})", hint=hint
            )
        if sha256_file(source / rel) != want:
            raise VerificationError(
                f"--source {source}: {rel} differs from the file {artifact} was quantized from ({what})", hint=hint
            )
    return None


def check_shapes(artifact: Path, source: Path) -> None:
    """Every source mtp.* tensor has the shape the artifact's config.json implies (StageError otherwise)."""
    from qwenquant.checkpoint.config import mtp_shapes, read_config
    from qwenquant.checkpoint.tensorfile import checkpoint_refs

    want = mtp_shapes(read_config(artifact))
    got = {n: tuple(r.shape) for n, r in checkpoint_refs(source).items() if n.startswith("mtp.")}
    hint = "pass the model this artifact was quantized from as --source"
    if not want:
        raise StageError(f"{artifact}/config.json implies no MTP head (mtp_num_hidden_layers, sizes)", hint=hint)
    for name in sorted(want):
        if name not in got:
            raise StageError(f"--source {source} has no {name}, which {artifact}/config.json implies", hint=hint)
        if got[name] != want[name]:
            raise StageError(
                f"--source {source}: {name} has shape {list(got[name])}, but {artifact}/config.json "
                f"implies {list(want[name])}: the head is another model's",
                hint=hint,
            )
    extra = sorted(set(got) - set(want))
    if extra:
        raise StageError(f"--source {source} has {extra[0]}, which {artifact}/config.json does not imply", hint=hint)


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
    return shards | {
        p.name
        for p in artifact.iterdir()
        if p.is_file() and not p.is_symlink() and not p.name.startswith(".") and p.suffix != ".safetensors"
    }


def int4_mtp(artifact: Path) -> dict[str, Any] | None:
    """The packed MTP Linears of an artifact whose MTP head is int4 (its manifest's recipe says
    `mtp: {quantize: gptq}`; without a manifest, packed mtp.* tensors under a config that does not
    ignore them), name -> tensor; None for a bf16 head. graft-mtp cannot rebuild them from the
    source: a missing one is an error."""
    from qwenquant.checkpoint.config import read_config
    from qwenquant.checkpoint.names import MTP_PREFIX, targets_cover
    from qwenquant.manifest import MANIFEST_NAME, load_manifest
    from qwenquant.quantize.stages.mtp import present_refs
    from qwenquant.recipe.rules import MTP_LINEARS

    _, refs = present_refs(artifact)  # a deleted MTP-only shard is what graft-mtp restores
    packed = {n: r for n, r in refs.items() if n.startswith(MTP_PREFIX) and n.rsplit(".", 1)[1].startswith("weight_")}
    if (artifact / MANIFEST_NAME).is_file():
        quantized = (load_manifest(artifact).recipe.get("mtp") or {}).get("quantize") == "gptq"
    else:
        qc = read_config(artifact).get("quantization_config") or {}
        quantized = bool(packed) and not targets_cover(qc.get("ignore") or [], "mtp.fc")
    if not quantized:
        return None
    missing = [m for m in MTP_LINEARS if f"{m}.weight_packed" not in packed]
    if missing:
        raise StageError(
            f"{artifact}: the MTP head is int4 (mtp.quantize: gptq) but {missing[0]} has no packed "
            "tensors; graft-mtp restores only tensors the source holds",
            hint="re-run `qwenquant quantize` (the gptq stage keeps the quantized head)",
        )
    return packed


def check_graft_writable(artifact: Path) -> None:
    """UsageError (exit 2) when graft-mtp cannot rebuild `artifact` where it is: the folder beside it
    (where the new folder is built, then renamed) or the artifact itself (moved aside) is on a read-only
    mount or not writable. Checked before anything is written."""
    for folder in (artifact.parent, artifact):
        try:
            fd, scratch = tempfile.mkstemp(dir=folder, prefix=".qwenquant-write-test-")
            os.close(fd)
            os.unlink(scratch)
        except OSError as e:
            raise UsageError(
                f"graft-mtp rebuilds {artifact} in {artifact.parent}, but {folder} cannot be written "
                f"({e.strerror or e})",
                hint="nothing was changed: remount it read-write or fix its permissions, or copy the "
                "artifact to a folder you can write and graft there",
            ) from None
    if os.path.ismount(artifact):
        raise UsageError(
            f"graft-mtp rebuilds {artifact} beside it and renames it into place, but it is a mount point",
            hint="nothing was changed: copy the artifact into a folder (not a mount point) and graft there",
        )


_WRITE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EBUSY, errno.EXDEV)


def _check_only_mtp_differs(artifact: Path, packed: Any) -> None:
    """Re-hashing blesses whatever is on disk: only the files a graft repairs may differ from the manifest
    (`packed`: the artifact's int4 MTP head, whose shard cannot be rebuilt from the source)."""
    from qwenquant.errors import VerificationError
    from qwenquant.manifest import verify_artifact

    before = verify_artifact(artifact)
    others = [
        f
        for f in before.bad_files
        if f not in ("model.safetensors.index.json", "config.json") and ("mtp" not in f or packed)
    ]
    if others:
        raise VerificationError(
            f"{artifact}: files besides the MTP shard, index and config differ from the manifest: "
            + ", ".join(others[:5]),
            hint="graft-mtp repairs only the MTP head; re-run `qwenquant quantize`",
        )


def _guard_target(artifact: Path, force: bool) -> Removal | None:
    """outfolder's guard over the entries of `artifact` that are not part of it (graft-mtp rebuilds the folder
    and would drop them): refused, or with --force their Removal, applied only with the old folder once the
    grafted one replaced it (None when there are none)."""
    from qwenquant import outfolder

    foreign = outfolder.foreign_in_graft_target(artifact, graft_keeps(artifact))
    return outfolder.guard(
        artifact,
        foreign,
        force=force,
        flag="artifact",
        remove=foreign,
        problem="holds entries that are not part of the artifact (graft-mtp rebuilds the folder and would drop them)",
    )


def _check_source(artifact: Path, source: Path) -> None:
    """Both folders' safetensors headers, then `source` proven the artifact's own (or a warning that it cannot
    be) and its MTP tensors of the shapes the artifact's config implies."""
    for folder in (artifact, source):
        _check_headers(folder)
    warning = prove_source(artifact, source)
    if warning:
        log.warning("%s", warning)
    check_shapes(artifact, source)


def _write_grafted(artifact: Path, source: Path, plan: Any, packed: Any, had_manifest: bool) -> str | None:
    """The grafted artifact built in a staging folder beside `artifact` and renamed into its place, with its
    manifest refreshed (when it had one: the new root digest, else None); a StageError naming the disk when a
    write fails, nothing changed and nothing left behind."""
    from qwenquant.checkpoint.assemble import carry_files
    from qwenquant.manifest import MANIFEST_NAME
    from qwenquant.quantize.stages.mtp import graft_into

    try:
        with staging_dir(artifact) as tmp:  # removed on any failure: nothing is left beside the artifact
            graft_into(artifact, tmp, source, plan, packed)
            carry_files(artifact, tmp, drop=[MANIFEST_NAME])
            root = refresh_manifest(tmp, {"graft_mtp": plan.summary()}, previous=artifact) if had_manifest else None
    except OSError as e:
        if e.errno not in _WRITE_ERRNOS:
            raise
        raise StageError(
            f"graft-mtp could not write the grafted artifact beside {artifact} "
            f"({e.strerror or e}{f': {e.filename}' if e.filename else ''})",
            hint="nothing was changed and nothing was left behind: free some space on that disk "
            "(the graft writes the MTP shard and any shard it rewrites) and re-run",
        ) from None
    return root


def graft_mtp(artifact: Path, source: Path, *, check_only: bool = False, force: bool = False) -> dict[str, Any]:
    """`qwenquant graft-mtp`: put the source MTP tensors back into an artifact (idempotent); an int4
    head's packed Linears (`int4_mtp`) stay the artifact's, the rest comes from the source."""
    from qwenquant.manifest import MANIFEST_NAME, verify_artifact
    from qwenquant.quantize.stages.mtp import plan_for, verify_mtp

    artifact, source = Path(artifact).resolve(), Path(source).resolve()
    for p, what in ((artifact, "artifact"), (source, "source")):
        if not (p / "config.json").is_file():
            raise StageError(f"{what} folder {p} has no config.json", hint=f"check the {what} path")
    # --force removes them only with the old folder, once the grafted one replaced it
    removal = None if check_only else _guard_target(artifact, force)
    _check_source(artifact, source)
    packed = int4_mtp(artifact)
    plan = plan_for(artifact, source, packed)
    if check_only or plan.nothing_to_do:
        return {
            "artifact": str(artifact),
            "plan": plan.summary(),
            "nothing_to_do": plan.nothing_to_do,
            "written": False,
        }
    had_manifest = (artifact / MANIFEST_NAME).is_file()
    if had_manifest:
        _check_only_mtp_differs(artifact, packed)
    check_graft_writable(artifact)
    if removal is not None:
        log.warning("--force: removing %s (the grafted artifact takes the folder's place)", removal.said)
    root = _write_grafted(artifact, source, plan, packed, had_manifest)
    problems = verify_mtp(artifact, source, packed and int4_mtp(artifact))
    if had_manifest:
        report = verify_artifact(artifact)
        if not report.ok:
            problems += [str(p) for p in report.problems]
    if problems:
        raise StageError("graft-mtp: the artifact still fails: " + "; ".join(problems), hint="re-run graft-mtp")
    return {
        "artifact": str(artifact),
        "plan": plan.summary(),
        "nothing_to_do": False,
        "written": True,
        "root_digest": root,
    }
