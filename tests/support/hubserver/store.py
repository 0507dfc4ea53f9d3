"""What uploads change in the loopback hub (pure state, no HTTP): new repos, LFS objects, commits, squashes.

Bytes that arrive over the wire live in the server's store folder, named by their sha256. A commit is
built completely (every LFS object present with its size, every path valid) before the branch moves:
a refused commit changes nothing, as on the Hub.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from qwenquant.testbed.hubserver.repos import (
    Commit,
    HubFile,
    Repo,
    commit_id,
    git_blob_id,
    gitattributes,
    is_lfs_path,
    lfs_pointer,
    scan_file,
)

REGULAR_MAX = 10 * 2**20  # the Hub refuses regular (non-LFS) files above 10 MB
INITIAL_TITLE = "initial commit"


class CommitRefused(Exception):
    """The Hub would answer this request with `status` (and the X-Error-Code `code`)."""

    def __init__(self, status: int, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


def upload_mode(path: str, size: int, sample: bytes) -> str:
    """ "lfs" or "regular", as the Hub's preupload decides: LFS patterns, size, binary content."""
    return "lfs" if is_lfs_path(path) or size > REGULAR_MAX or b"\0" in sample else "regular"


def store_bytes(store: Path, data: bytes) -> Path:
    """Keep `data` in the store under its sha256 (written once, atomically)."""
    final = store / hashlib.sha256(data).hexdigest()
    if not final.exists():
        tmp = store / f".{uuid.uuid4().hex}.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, final)
    return final


def new_repo(repo_id: str, repo_type: str, private: bool, store: Path) -> Repo:
    """A repo whose `main` holds one commit with the Hub's default .gitattributes."""
    repo = Repo(repo_id, repo_type, private=private)
    source = store_bytes(store, gitattributes())
    files = {".gitattributes": scan_file(source, ".gitattributes", lfs=False)}
    sha = commit_id(files, f"{repo_type}/{repo_id}")
    repo.commits[sha] = Commit(sha, files, INITIAL_TITLE)
    repo.branches["main"] = sha
    return repo


def existing_oid(repo: Repo, revision: str, path: str) -> str | None:
    """What preupload reports for a path already at `revision`: sha256 (LFS) or git blob id."""
    commit = repo.commits.get(repo.branches.get(revision, revision))
    f = commit.files.get(path) if commit else None
    if f is None:
        return None
    return f.sha256 if f.lfs else f.blob_id


def _clean(path: Any) -> str:
    if (
        not isinstance(path, str)
        or not path
        or path.startswith("/")
        or "\\" in path
        or "\0" in path
        or any(p in ("", ".", "..") for p in path.split("/"))
    ):
        raise CommitRefused(400, f"invalid path {path!r}", "InvalidPath")
    return path


def apply_commit(repo: Repo, branch: str, lines: Iterable[dict[str, Any]], store: Path) -> Commit:
    """Build the commit an ndjson body describes on top of `branch`, move the branch, return it."""
    head_sha = repo.branches.get(branch)
    if head_sha is None:
        raise CommitRefused(404, f"Invalid rev id: {branch}", "RevisionNotFound")
    files = dict(repo.commits[head_sha].files)
    title = "upload"
    for item in lines:
        key, value = item.get("key"), item.get("value") or {}
        if key == "header":
            title = str(value.get("summary") or title)
            parent = value.get("parentCommit")
            if parent and parent != head_sha:
                raise CommitRefused(412, "A commit has happened since. Please refresh and try again.")
        elif key == "file":
            path = _clean(value.get("path"))
            try:
                data = base64.b64decode(value.get("content", ""), validate=True)
            except (binascii.Error, ValueError):
                raise CommitRefused(400, f"{path}: content is not base64") from None
            if len(data) > REGULAR_MAX or b"\0" in data[:8000]:
                raise CommitRefused(400, f"{path}: binary or large files must be committed through LFS")
            files[path] = scan_file(store_bytes(store, data), path, lfs=False)
        elif key == "lfsFile":
            path, oid = _clean(value.get("path")), str(value.get("oid"))
            source = repo.lfs.get(oid)
            if source is None or (value.get("size") is not None and source.stat().st_size != value["size"]):
                raise CommitRefused(400, f"{path}: LFS object {oid} was not uploaded (or has another size)")
            size = source.stat().st_size
            files[path] = HubFile(path, source, size, oid, git_blob_id(lfs_pointer(oid, size)), True)
        elif key == "deletedFile":
            if files.pop(_clean(value.get("path")), None) is None:
                raise CommitRefused(404, f"A file with this name doesn't exist: {value.get('path')}", "EntryNotFound")
        elif key == "deletedFolder":
            prefix = _clean(str(value.get("path", "")).rstrip("/")) + "/"
            files = {p: f for p, f in files.items() if not p.startswith(prefix)}
        else:
            raise CommitRefused(400, f"unknown commit line {key!r}")
    sha = commit_id(files, head_sha)
    repo.commits[sha] = Commit(sha, files, title)
    repo.branches[branch] = sha
    return repo.commits[sha]


def squash(
    repo: Repo, store: Path, generation: int, change: str | None = None, at: int | None = None
) -> dict[str, str]:
    """Rewrite history: every branch becomes one new parentless commit with the same files (the
    byte at `at` of `change` flipped, when given); every old commit is gone. Returns branch -> commit."""
    heads = {b: repo.commits[sha] for b, sha in repo.branches.items()}
    repo.commits.clear()
    for branch, old in heads.items():
        files = dict(old.files)
        if change is not None and change in files and files[change].size:
            f = files[change]
            data = bytearray(f.source.read_bytes())
            data[min(len(data) - 1, at if at is not None else len(data) // 2)] ^= 0xFF
            source = store_bytes(store, bytes(data))
            files[change] = scan_file(source, change, lfs=f.lfs)
            if f.lfs:
                repo.lfs[files[change].sha256] = source
        sha = commit_id(files, f"squash {generation} {branch}")
        repo.commits[sha] = Commit(sha, files, f"squashed history ({branch})")
        repo.branches[branch] = sha
    return dict(repo.branches)
