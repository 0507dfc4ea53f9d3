"""The fetch record (`qwenquant-fetch.json`): what was fetched, from where, with every digest."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qwenquant import __version__
from qwenquant.atomic import atomic_write_json
from qwenquant.errors import VerificationError
from qwenquant.fetch.selection import RECORD_NAME, STAGING_NAME
from qwenquant.hashing import sha256_files, snapshot_root_digest

if TYPE_CHECKING:
    from qwenquant.fetch.selection import RemoteFile
    from qwenquant.fetch.transfer import FileDigest

SCHEMA_VERSION = 1


def root_digest(files: list[dict[str, Any]]) -> str:
    """One digest naming the whole snapshot (formula: hashing.snapshot_root_digest)."""
    return snapshot_root_digest(files)


def load_fetch_record(out_dir: Path) -> dict[str, Any]:
    """Read `out_dir/qwenquant-fetch.json`; raise VerificationError if it is absent or unreadable."""
    return load_record_file(Path(out_dir) / RECORD_NAME, Path(out_dir))


def load_record_file(path: Path, out_dir: Path | None = None) -> dict[str, Any]:
    """Read a fetch record file (e.g. `--expect RECORD`); VerificationError if absent or unreadable."""
    path = Path(path)
    out_dir = out_dir or path.parent
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        raise VerificationError(
            f"{path} not found: {out_dir} is not a completed fetch",
            hint=f"run `qwenquant fetch <repo> --out {out_dir}` first",
        ) from None
    except (OSError, ValueError) as e:
        raise VerificationError(f"{path} is unreadable ({e})", hint="re-run `qwenquant fetch`") from None
    if not isinstance(record, dict) or record.get("schema_version") != SCHEMA_VERSION or "files" not in record:
        raise VerificationError(
            f"{path} is not a schema {SCHEMA_VERSION} fetch record", hint="re-run `qwenquant fetch`"
        )
    return record


@dataclass
class RecordCheck:
    """What `--offline` found: files missing, changed (size or sha256), or not in the record."""

    record: dict[str, Any]
    missing: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.changed or self.extra)

    def summary(self) -> str:
        parts = [f"{kind} {', '.join(names[:3])}{f' and {len(names) - 3} more' if len(names) > 3 else ''}"
                 for kind, names in (("changed", self.changed), ("missing", self.missing), ("extra", self.extra))
                 if names]  # fmt: skip
        return "; ".join(parts)


def _files_on_disk(out_dir: Path) -> set[str]:
    found = set()
    for root, dirs, names in os.walk(out_dir):
        dirs[:] = [d for d in dirs if not (Path(root) == out_dir and d == STAGING_NAME)]
        for name in names:
            rel = (Path(root) / name).relative_to(out_dir).as_posix()
            if rel != RECORD_NAME:
                found.add(rel)
    return found


def extra_files(out_dir: Path, record: dict[str, Any]) -> list[str]:
    """Files in a fetched folder that its record does not list (fetch keeps them; the source check refuses them)."""
    return sorted(_files_on_disk(Path(out_dir)) - {f["path"] for f in record["files"]})


def check_fetch_record(out_dir: Path, progress: Callable[[int], None] | None = None) -> RecordCheck:
    """Re-hash every recorded file (in parallel) and compare with the record; list extra files."""
    out_dir = Path(out_dir)
    record = load_fetch_record(out_dir)
    check = RecordCheck(record)
    present: dict[Path, dict[str, Any]] = {}
    for f in record["files"]:
        p = out_dir / f["path"]
        if p.is_symlink() or not p.is_file():
            check.missing.append(f["path"])
        elif p.stat().st_size != f["size"]:
            check.changed.append(f["path"])
        else:
            present[p] = f
    for p, digest in sha256_files(present, progress=progress).items():
        if digest != present[p]["sha256"]:
            check.changed.append(present[p]["path"])
    recorded = {f["path"] for f in record["files"]}
    check.extra = sorted(_files_on_disk(out_dir) - recorded)
    check.changed.sort()
    return check


def verify_fetch_record(out_dir: Path, progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Re-verify a fetched folder against its record; return the record or raise VerificationError."""
    check = check_fetch_record(out_dir, progress)
    if not check.ok:
        raise VerificationError(
            f"{out_dir} does not match its fetch record: {check.summary()}", hint=repair_hint(check, out_dir)
        )
    return check.record


def repair_hint(check: RecordCheck, out_dir: Path) -> str:
    """What repairs the folder: fetch restores changed and missing files; files the record does not
    list are not the fetch's to touch, so the hint names them for removal."""
    steps = []
    if check.missing or check.changed:
        steps.append(
            f"re-run `qwenquant fetch {check.record.get('repo_id', '<repo>')} --out {out_dir}` to restore "
            "the changed and missing files"
        )
    if check.extra:
        names = " ".join(str(Path(out_dir) / n) for n in check.extra[:5])
        more = f" and {len(check.extra) - 5} more" if len(check.extra) > 5 else ""
        steps.append(f"remove the files the fetch did not write (fetch keeps them): {names}{more}")
    return "; ".join(steps)


def write_record(out_dir: Path, repo_id: str, repo_type: str, revision: str, commit: str, endpoint: str,
                 files: list[RemoteFile], digests: dict[str, FileDigest],
                 pinned: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    """Write `out_dir`'s fetch record, last: the repo, the commit, every file with its digests, the root digest
    (`pinned`: the content pin that took a new commit, when one did)."""
    entries = [{"path": f.path, "size": f.size, "sha256": digests[f.path].sha256,
                "git_blob_id": f.blob_id, "lfs": f.lfs} for f in sorted(files, key=lambda f: f.path)]  # fmt: skip
    record = {
        "schema_version": SCHEMA_VERSION, "tool": "qwenquant", "tool_version": __version__,
        "repo_id": repo_id, "repo_type": repo_type, "revision": revision, "commit": commit, "endpoint": endpoint,
        "fetched_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "files": entries, "root_digest": root_digest(entries),
        "total_bytes": sum(f.size for f in files),
        **({"content_pinned": pinned} if pinned else {}),
    }  # fmt: skip
    atomic_write_json(out_dir / RECORD_NAME, record)
    return record
