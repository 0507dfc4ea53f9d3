"""`publish_artifact`: verify, build the card, compare with the revision, one commit (or none)."""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qwenquant.errors import UsageError, VerificationError
from qwenquant.hashing import sha256_file
from qwenquant.manifest import (
    CARD_NAME,
    CARD_RECORD_NAME,
    MANIFEST_NAME,
    REPORTS_DIR,
    SIGNATURE_NAME,
    UNCHECKED_COMPANIONS,
    Manifest,
    load_manifest,
    verify_artifact,
)
from qwenquant.publish.card import Card, build_card, read_facts
from qwenquant.publish.figures import Figure, collect_figures, not_measured
from qwenquant.publish.hub import Progress
from qwenquant.publish.plan import LocalFile, PublishPlan, RemoteFile, plan_upload
from qwenquant.publish.records import PublishedFile, PublishRecord
from qwenquant.publish.reports import Report, gather_reports

log = logging.getLogger(__name__)


@dataclass
class PublishResult:
    repo_id: str
    revision: str
    root_digest: str
    files: list[LocalFile]
    card: Card
    dry_run: bool = False
    plan: PublishPlan | None = None
    commit: str | None = None
    url: str | None = None
    sign: bool = False
    warnings: list[str] = field(default_factory=list)

    @property
    def noop(self) -> bool:
        return self.plan is not None and self.plan.noop

    def record(self) -> PublishRecord:
        """What `qwenquant publish --json` prints."""
        return PublishRecord(
            repo_id=self.repo_id,
            revision=self.revision,
            root_digest=self.root_digest,
            dry_run=self.dry_run,
            noop=self.noop,
            commit=self.commit,
            url=self.url,
            files=[PublishedFile(path=f.path, size=f.size, sha256=f.sha256) for f in self.files],
            uploaded=[f.path for f in self.plan.upload] if self.plan else None,
            deleted=list(self.plan.delete) if self.plan else None,
            unchanged=list(self.plan.unchanged) if self.plan else None,
            signed=self.sign,
            card=self.card.readme.decode(),
            warnings=list(self.warnings),
        )


def check_repo_id(repo_id: str) -> None:
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as e:
        raise UsageError(
            f"{repo_id!r} is not a Hub repo id: {e}".splitlines()[0],
            hint="write it as OWNER/NAME, e.g. me/Qwen3.8-27B-w4a16",
        ) from None
    if "/" not in repo_id:
        raise UsageError(f"{repo_id!r} names no owner", hint="write it as OWNER/NAME, e.g. me/Qwen3.8-27B-w4a16")


def _companion_clash(paths: Sequence[str]) -> str | None:
    names = (*UNCHECKED_COMPANIONS, CARD_NAME, CARD_RECORD_NAME)
    return next((p for p in paths if p in names or p.startswith(REPORTS_DIR + "/")), None)


def card_files(
    artifact: Path,
    manifest: Manifest,
    manifest_digest: str,
    repo_id: str,
    revision: str,
    reports: Sequence[Path],
    license_id: str | None,
    signed: bool = False,
) -> tuple[list[LocalFile], Card, list[str], str]:
    """The files of a verified artifact and its card files: (files to publish, card, warnings, root digest);
    `manifest_digest`: the manifest's self digest as its file records it."""
    reps = gather_reports(artifact, manifest.root_digest, reports)
    figures = collect_figures(manifest, reps, manifest.root_digest)
    _refuse_conflicts(figures, reps)
    facts = read_facts(artifact, manifest, license_id)
    card = build_card(
        manifest,
        manifest_digest,
        facts,
        repo_id=repo_id,
        revision=revision,
        license_id=facts.source_license or "other",
        reports=reps,
        figures=figures,
        missing=not_measured(figures),
        signed=signed,
    )
    files = [LocalFile(f.path, f.size, f.sha256, source=artifact / f.path) for f in manifest.files]
    files.append(
        LocalFile(
            MANIFEST_NAME,
            (artifact / MANIFEST_NAME).stat().st_size,
            sha256_file(artifact / MANIFEST_NAME),
            source=artifact / MANIFEST_NAME,
        )
    )
    generated = {CARD_NAME: card.readme, CARD_RECORD_NAME: card.record_bytes, **{r.repo_path: r.raw for r in reps}}
    files += [LocalFile(p, len(b), hashlib.sha256(b).hexdigest(), data=b) for p, b in sorted(generated.items())]
    return files, card, list(facts.warnings), manifest.root_digest


def _verified(artifact: Path) -> tuple[Manifest, str]:
    """The manifest of an artifact that verifies, and its self digest as its file records it."""
    report = verify_artifact(artifact)
    if not report.ok:
        raise VerificationError(
            f"refusing to publish {artifact}: it does not match its manifest: "
            + ", ".join(f"{p.path} ({p.status})" for p in report.problems[:5]),
            hint="`qwenquant verify` shows the report; rebuild or restore the artifact",
        )
    manifest = load_manifest(artifact)
    clash = _companion_clash([f.path for f in manifest.files])
    if clash:
        raise UsageError(
            f"{artifact}'s manifest lists {clash}, a name the published card files use",
            hint="rebuild the artifact without it; the card, its record and the reports go beside it",
        )
    return manifest, str(json.loads((artifact / MANIFEST_NAME).read_bytes())["manifest_self_digest"])


def _refuse_conflicts(figures: Sequence[Figure], reps: Sequence[Report]) -> None:
    """Two reports giving one measurement two values: refused, both files and values named."""
    from qwenquant.publish.figures import conflicts

    found = conflicts(figures)
    if found:
        local = {r.repo_path: str(r.source) for r in reps}
        a, b = found[0]
        raise UsageError(
            f"{local.get(a.source, a.source)} and {local.get(b.source, b.source)} give {a.section} "
            f"'{a.label}' of one configuration (`{a.command}`) as {a.text} and {b.text}: a card cannot "
            f"cite both{f' ({len(found) - 1} more figures differ)' if len(found) > 1 else ''}",
            hint="keep the report you stand by: move the other away from beside the artifact or drop its --report",
        )


@dataclass(frozen=True)
class RemoteCard:
    """What a re-publish keeps of the revision's card: the license it names and the signature its record names
    (None: not named, or no card)."""

    license: str | None = None
    signature: str | None = None


def remote_card(api: Any, repo_id: str, head: str | None, remote: Mapping[str, RemoteFile]) -> RemoteCard:
    """The revision's card record (license, signature), with the license from the card's front matter
    when the record has none; nothing named when the revision has no card."""
    from qwenquant.publish import hub
    from qwenquant.publish.cardcheck import front_license

    if head is None or CARD_RECORD_NAME not in remote:
        return RemoteCard()
    try:
        rec = json.loads(hub.download_file(api, repo_id, head, CARD_RECORD_NAME))
    except ValueError:
        rec = None
    rec = rec if isinstance(rec, dict) else {}
    lic, sig = rec.get("license"), rec.get("signature")
    if not isinstance(lic, str) and CARD_NAME in remote:
        lic = front_license(hub.download_file(api, repo_id, head, CARD_NAME).decode(errors="replace"))
    return RemoteCard(lic if isinstance(lic, str) else None, sig if isinstance(sig, str) else None)


def git_blob(f: LocalFile) -> str:
    data = f.data if f.data is not None else Path(f.source or "").read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def publish_artifact(
    artifact: Path,
    repo_id: str,
    *,
    revision: str = "main",
    private: bool = False,
    dry_run: bool = False,
    reports: Sequence[Path] = (),
    license_id: str | None = None,
    sign_key: Path | None = None,
    endpoint: str | None = None,
) -> PublishResult:
    """Publish `artifact` to `repo_id`@`revision` in one commit; a no-op when the revision holds it already.
    `dry_run`: verify and build the card only, no network."""
    from qwenquant import signing

    artifact = Path(artifact)
    check_repo_id(repo_id)
    if sign_key is not None:
        signing._model_signing()
        signing._readable(sign_key, "private key", "--sign-key")
    manifest, manifest_digest = _verified(artifact)
    files, card, warnings, root = card_files(
        artifact, manifest, manifest_digest, repo_id, revision, reports, license_id, signed=sign_key is not None
    )
    result = PublishResult(
        repo_id, revision, root, files, card, dry_run=dry_run, sign=sign_key is not None, warnings=warnings
    )
    if dry_run:
        return result
    import os

    from huggingface_hub import HfApi, constants
    from huggingface_hub.utils import disable_progress_bars

    from qwenquant.console import interactive
    from qwenquant.publish import hub

    if not interactive():
        disable_progress_bars()  # the client's tqdm bars: only on a terminal, as ours
    # HF_ENDPOINT as it is now (huggingface_hub reads it once, at import), as fetch does
    api = HfApi(endpoint=(endpoint or os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/"))
    where = Progress()
    try:
        return _to_hub(api, artifact, result, manifest, manifest_digest, reports, license_id, sign_key, private, where)
    except KeyboardInterrupt:
        at = f"still at commit {where.head}" if where.head else "without a commit of this artifact"
        said = {
            "reading the revision": f"nothing was committed: {repo_id}@{revision} is {at}",
            "uploading": f"nothing was committed: {repo_id}@{revision} is {at}; the objects already uploaded "
            "are not sent again",
            "committing": f"the commit was under way: {repo_id}@{revision} is either {at} or at the new commit",
            "checking": f"{repo_id}@{revision} is at the new commit {where.commit}; its listing was not checked",
        }[where.step]
        raise hub.PublishInterrupted(
            f"interrupted while {where.step}: {said}",
            hint="re-run the same command: it finishes the job, or finds it done",
        ) from None


def _kept_license(theirs: RemoteCard, license_id: str | None) -> str | None:
    """The license the repo's card names, kept by a re-publish without --license (None for "other" or none)."""
    lic = theirs.license if license_id is None else None
    return None if lic == "other" else lic


def _signature(artifact: Path, files: Sequence[LocalFile], sign_key: Path, view: Path, sig_path: Path) -> LocalFile:
    """The signature file over `view`, the folder as a downloader will have it (written there first)."""
    from qwenquant import signing

    signing.published_view(artifact, {f.path: f.data for f in files if f.data is not None}, view)
    signing.sign_artifact(view, sign_key, sig_path)
    data = sig_path.read_bytes()
    return LocalFile(SIGNATURE_NAME, len(data), hashlib.sha256(data).hexdigest(), data=data)


def _recard(
    result: PublishResult,
    artifact: Path,
    manifest: Manifest,
    manifest_digest: str,
    reports: Sequence[Path],
    license_id: str | None,
    *,
    signed: bool,
) -> None:
    """Build the result's files and card again (another license, or the signature named or not)."""
    result.files, result.card, _, _ = card_files(
        artifact, manifest, manifest_digest, result.repo_id, result.revision, reports, license_id, signed=signed
    )


def _to_hub(
    api: Any,
    artifact: Path,
    result: PublishResult,
    manifest: Manifest,
    manifest_digest: str,
    reports: Sequence[Path],
    license_id: str | None,
    sign_key: Path | None,
    private: bool,
    where: Progress,
) -> PublishResult:
    """The Hub steps of publish_artifact; `where` says how far they got (for Ctrl-C)."""
    from qwenquant.publish import hub

    repo_id, revision = result.repo_id, result.revision
    hub.ensure_revision(api, repo_id, revision, private)
    head, remote = hub.remote_state(api, repo_id, revision)
    where.head = head
    theirs = remote_card(api, repo_id, head, remote)
    # a re-publish keeps the license the repo's card names (only --license changes it; the source's README
    # named one the first publish may have overridden), and names the signature there when it may be kept
    # (it is checked against the plan below): the same artifact published again is then a no-op
    lic = _kept_license(theirs, license_id)
    keep_sig = sign_key is None and SIGNATURE_NAME in remote and theirs.signature == SIGNATURE_NAME
    recard = functools.partial(_recard, result, artifact, manifest, manifest_digest, reports, lic or license_id)
    if (lic and lic != result.card.record.license) or keep_sig:
        result.warnings[:] = [w for w in result.warnings if not (lic and "license is unknown" in w)]
        recard(signed=sign_key is not None or keep_sig)
    with tempfile.TemporaryDirectory() as tmp:
        plan, sig = _plan(api, result, head, remote, artifact, sign_key, Path(tmp), keep_sig, recard)
        if plan.noop:
            result.commit = head
            return result
        log.info(
            "uploading %d files (%.1f MiB), deleting %d, %d already on %s@%s",
            len(plan.upload),
            sum(f.size for f in plan.upload) / 2**20,
            len(plan.delete),
            len(plan.unchanged),
            repo_id,
            revision,
        )
        if SIGNATURE_NAME in plan.delete:
            result.warnings.append(
                f"{SIGNATURE_NAME} on the Hub signs other files: removed (pass --sign-key to sign this artifact)"
            )
        where.step = "uploading"
        message = f"qwenquant publish {artifact.name} (root digest {result.root_digest[:16]})"
        info = hub.commit_plan(api, repo_id, revision, plan, head, message, where)
    result.commit, result.url = info.oid, info.commit_url
    where.step, where.commit = "checking", info.oid
    kept = {".gitattributes"} | ({SIGNATURE_NAME} if plan.kept_signature or sig else set())
    hub.check_published(api, repo_id, info.oid, result.files, kept, git_blob)
    return result


def _plan(
    api: Any,
    result: PublishResult,
    head: str | None,
    remote: dict[str, RemoteFile],
    artifact: Path,
    sign_key: Path | None,
    tmp: Path,
    keep_sig: bool,
    recard: Callable[..., None],
) -> tuple[PublishPlan, LocalFile | None]:
    """The upload plan against the revision and this artifact's new signature (None: not signing). The
    signature on the Hub is kept only when it holds for the files as published; when it is not kept, the
    card is built again without naming it."""
    from qwenquant import signing
    from qwenquant.publish import hub

    view = tmp / "view"  # the folder as a downloader will have it: what the signature covers
    sig = _signature(artifact, result.files, sign_key, view, tmp / SIGNATURE_NAME) if sign_key is not None else None

    def remote_signature_ok() -> bool:
        remote_sig = tmp / "remote.sig"
        remote_sig.write_bytes(hub.download_file(api, result.repo_id, head or result.revision, SIGNATURE_NAME))
        try:
            covered = signing.verify_signature(
                view,
                remote_sig,
                signing.public_key_pem(sign_key),  # type: ignore[arg-type]
                view=True,
            )
        except VerificationError as e:
            log.info("the signature on the Hub does not hold for this key: %s", e)
            return False
        return bool(covered.card_files)  # one made before the card was signed is made again

    result.plan = plan = plan_upload(
        result.files, remote, git_blob, signature=sig, remote_signature_ok=remote_signature_ok
    )
    if keep_sig and SIGNATURE_NAME in plan.delete:  # the signed files changed: that signature goes, unnamed
        recard(signed=False)
        result.plan = plan = plan_upload(result.files, remote, git_blob)
    return plan, sig
