"""What one publish commit holds (pure): the local files against the revision's listing.

A file the revision already holds with the same content (sha256 of an LFS file, git blob id of a
regular one) is not sent again; nothing different at all is a no-op. Files of an earlier artifact
that this one lacks are deleted in the same commit, so the revision holds exactly the manifest's
files, the card files and (kept or new) the signature, beside the Hub's own .gitattributes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from qwenquant.manifest import SIGNATURE_NAME

HUB_OWN = (".gitattributes",)


@dataclass(frozen=True)
class LocalFile:
    """A file to publish: from the artifact folder (`source`) or generated (`data`)."""

    path: str
    size: int
    sha256: str
    source: Path | None = None
    data: bytes | None = None


@dataclass(frozen=True)
class RemoteFile:
    """A file of the revision's listing."""

    path: str
    size: int
    blob_id: str
    sha256: str | None  # LFS files only


@dataclass
class PublishPlan:
    upload: list[LocalFile] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    kept_signature: bool = False

    @property
    def noop(self) -> bool:
        return not (self.upload or self.delete)


def same_content(local: LocalFile, remote: RemoteFile, git_blob: Callable[[LocalFile], str]) -> bool:
    if remote.size != local.size:
        return False
    return remote.sha256 == local.sha256 if remote.sha256 else remote.blob_id == git_blob(local)


def plan_upload(
    local: list[LocalFile],
    remote: dict[str, RemoteFile],
    git_blob: Callable[[LocalFile], str],
    *,
    signature: LocalFile | None = None,
    remote_signature_ok: Callable[[], bool] = lambda: False,
) -> PublishPlan:
    """Decide the commit. `signature`: a new one to publish (None: no --sign-key); a signature on the
    revision is kept when the signed files are unchanged and (with a new one) `remote_signature_ok()`."""
    plan = PublishPlan()
    for f in local:
        r = remote.get(f.path)
        if r is not None and same_content(f, r, git_blob):
            plan.unchanged.append(f.path)
        else:
            plan.upload.append(f)
    signed_unchanged = not any(f.path != SIGNATURE_NAME and _signed(f.path) for f in plan.upload)
    if SIGNATURE_NAME in remote and signed_unchanged and (signature is None or remote_signature_ok()):
        plan.kept_signature = True
        plan.unchanged.append(SIGNATURE_NAME)
    elif signature is not None:
        plan.upload.append(signature)
    ours = {f.path for f in local} | ({SIGNATURE_NAME} if plan.kept_signature or signature else set())
    plan.delete = sorted(p for p in remote if p not in ours and p not in HUB_OWN)
    plan.unchanged.sort()
    return plan


def _signed(path: str) -> bool:
    """Is `path` among the files a signature covers (the manifest's files and the manifest)?"""
    from qwenquant.signing import IGNORED

    return not any(path == p or path.startswith(p + "/") for p in IGNORED)
