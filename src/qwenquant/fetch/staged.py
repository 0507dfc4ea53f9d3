"""The staged snapshot of a fetch (`.qwenquant-staging/tree/`): what is reused, what moves into place and
when, and what a refused fetch tidies away. The folder itself changes only in `move_into_place`."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from qwenquant.atomic import fsync_dir
from qwenquant.errors import FetchError, VerificationError
from qwenquant.fetch.pinning import PENDING_NAME
from qwenquant.fetch.selection import RECORD_NAME, STAGING_NAME, RemoteFile
from qwenquant.fetch.transfer import FileDigest
from qwenquant.hashing import CHUNK

log = logging.getLogger(__name__)

TREE_NAME = "tree"  # the staged snapshot inside .qwenquant-staging/


def tidy(out_dir: Path, staging: Path, new_out: bool, new_staging: bool) -> None:
    """After a refused or failed fetch: the staging area (and --out) this run created go again, unless
    partial downloads to resume are in it."""
    if not new_staging or any(staging.glob("*.part")) or any((staging / TREE_NAME).rglob("*")):
        return
    shutil.rmtree(staging, ignore_errors=True)
    if new_out:
        with contextlib.suppress(OSError):
            out_dir.rmdir()  # only when empty


def refuse_unnamed_companions(names: set[str], repo_id: str, commit: str, root: str | None) -> None:
    """A card record without the manifest it names, or a root pin on a repo with no manifest: refused."""
    from qwenquant.manifest import CARD_RECORD_NAME, MANIFEST_NAME

    if MANIFEST_NAME in names:
        return
    if CARD_RECORD_NAME in names:
        raise VerificationError(
            f"{repo_id}@{commit} holds {CARD_RECORD_NAME}, which names a {MANIFEST_NAME}, "
            "but the repo has no manifest: its files cannot be checked",
            hint="the repo was changed after publishing; never serve it; ask the publisher",
        )
    if root is not None:
        raise VerificationError(
            f"{repo_id}@{commit} has no {MANIFEST_NAME}, so its root digest cannot be {root}",
            hint="check the repo id and revision the publisher gave with the digest",
        )


def prune_tree(tree: Path, names: set[str]) -> None:
    """Staged files of an earlier, interrupted run that this commit does not list go (the tree is verified whole)."""
    if not tree.is_dir():
        return
    for p in sorted(tree.rglob("*"), reverse=True):
        rel = p.relative_to(tree).as_posix()
        if p.is_dir() and not p.is_symlink():
            if not any(n.startswith(rel + "/") for n in names):
                shutil.rmtree(p, ignore_errors=True)
        elif rel not in names:
            p.unlink()


def move_into_place(out_dir: Path, tree: Path, commit: str, files: list[RemoteFile]) -> None:
    """The verified tree into the folder: the old record goes first (the folder holds no finished fetch
    until the new record is written), then each file, then the files of an earlier commit."""
    stale = stale_paths(out_dir, commit, {f.path for f in files})
    with contextlib.suppress(FileNotFoundError):
        (out_dir / RECORD_NAME).unlink()
    for f in files:
        src, final = tree / f.path, out_dir / f.path
        final.parent.mkdir(parents=True, exist_ok=True)
        if not final.resolve().is_relative_to(out_dir.resolve()):
            raise FetchError(f"{f.path} would land outside {out_dir}", hint="remove symlinked folders from --out")
        if final.is_file() and os.path.samefile(src, final):
            continue  # reused where it was (hard link)
        os.replace(src, final)
        fsync_dir(final.parent)
    for rel in stale:
        p = out_dir / rel
        if p.is_file() and not p.is_symlink():
            log.info("removing %s (not in commit %s)", rel, commit)
            p.unlink()


def stale_paths(out_dir: Path, commit: str, paths: set[str]) -> list[str]:
    """Files an earlier fetch (record or pending run) of another commit put here and this one lacks."""
    ours: set[str] = set()
    for p in (out_dir / RECORD_NAME, out_dir / STAGING_NAME / PENDING_NAME):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            prev = json.loads(p.read_text())
            if prev["commit"] != commit:
                ours |= {f["path"] if isinstance(f, dict) else f for f in prev["files"]}
    return sorted(ours - paths)


def _local_digest(path: Path, f: RemoteFile) -> FileDigest:
    import hashlib

    h256, h1 = hashlib.sha256(), hashlib.sha1(f"blob {f.size}\0".encode())
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            h256.update(chunk)
            if not f.lfs:
                h1.update(chunk)
    return FileDigest(f.path, f.size, h256.hexdigest(), f.blob_id if f.lfs else h1.hexdigest(), f.lfs)


def reuse_verified(
    out_dir: Path, tree: Path, files: list[RemoteFile], workers: int
) -> tuple[dict[str, FileDigest], list[RemoteFile]]:
    """Files with the listed digest already staged (an interrupted run) or in place (hard-linked into the
    staged tree) are kept; the rest are to download."""
    candidates: list[tuple[RemoteFile, Path]] = []
    for f in files:
        p = out_dir / f.path
        if p.is_symlink():
            raise FetchError(f"{p} is a symlink; refusing to write through it", hint="remove it and re-run")
        for where in (tree / f.path, p):
            if where.is_file() and not where.is_symlink() and where.stat().st_size == f.size:
                candidates.append((f, where))
                if where != p and p.is_file() and os.path.samefile(where, p):
                    break  # staged as a link to the file in place: hashed once
    with ThreadPoolExecutor(max_workers=max(1, min(workers, 4))) as pool:
        local = list(pool.map(lambda c: _local_digest(c[1], c[0]), candidates))
    kept: dict[str, FileDigest] = {}
    for (f, where), d in zip(candidates, local, strict=True):
        if f.path in kept:
            continue
        if (d.sha256 == f.sha256) if f.lfs else (d.git_blob_id == f.blob_id):
            kept[f.path] = d
            if where != tree / f.path:
                _stage_link(where, tree / f.path)
        elif where == out_dir / f.path:
            log.warning("%s differs from the listing; downloading it again", f.path)
    return kept, [f for f in files if f.path not in kept]


def _stage_link(src: Path, dst: Path) -> None:
    """`src` (verified, in place) into the staged tree: a hard link, or a copy where links are refused."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        dst.unlink()
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
