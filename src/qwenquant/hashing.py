"""Digests: files (sha256 for LFS files and manifests, git blob sha1 for small Hub files, hashed in
parallel), byte ranges of files (a tensor of a shard), a run's digest cache, canonical JSON, and
the self-hashed JSON formats.

Self-hashed formats carry a digest of their own body under one field: the stage record and the
layer record (`record_sha256`), each stage entry of the manifest (`content_sha256`) and the
manifest (`manifest_self_digest`). Root digests name a whole file list; the fetch record's and the
manifest's formulas differ and are kept as they are (published digests depend on them).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from qwenquant.atomic import canonical_json

CHUNK = 8 * 1024 * 1024


def sha256_file(path: Path, progress: Callable[[int], None] | None = None) -> str:
    """Hex sha256 of a file, read in 8 MiB chunks (hashlib releases the GIL, so threads scale)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            if progress:
                progress(len(chunk))
    return h.hexdigest()


def sha256_range(path: Path, start: int, end: int) -> str:
    """Hex sha256 of bytes [start, end) of a file (a tensor's bytes), read in 8 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(start)
        left = end - start
        while left and (chunk := f.read(min(left, CHUNK))):
            h.update(chunk)
            left -= len(chunk)
    return h.hexdigest()


def sha256_json(obj: Any) -> str:
    """Hex sha256 of the canonical JSON of `obj` (sorted keys, fixed separators)."""
    return hashlib.sha256(canonical_json(obj)).hexdigest()


def sha256_files(
    paths: Iterable[Path], progress: Callable[[int], None] | None = None, workers: int | None = None
) -> dict[Path, str]:
    """sha256 of many files at once, on a thread pool."""
    paths = list(paths)
    workers = workers or min(8, (os.cpu_count() or 2) * 2)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        digests = list(pool.map(lambda p: sha256_file(p, progress), paths))
    return dict(zip(paths, digests, strict=True))


FileKey = tuple[int, int, int, int]  # (device, inode, size, mtime_ns)


def file_key(p: Path) -> FileKey:
    """What names one version of a file: its device, inode, size and mtime_ns."""
    st = Path(p).stat()
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class DigestCache:
    """sha256 of files and byte ranges, each read once in a run: keyed by the file's (device, inode,
    size, mtime_ns), taken before it is read, and the range, so a hard link of a file hashed earlier
    in the run costs nothing and a file rewritten or replaced since is read again. Verification
    (manifest.verify_artifact) never goes through it."""

    def __init__(self) -> None:
        self._cache: dict[tuple[FileKey, int, int], str] = {}

    @classmethod
    def of(cls, digests: DigestCache | None) -> DigestCache:
        """The run's cache when there is one, else a fresh one (every file read)."""
        return digests if digests is not None else cls()

    def file(self, p: Path) -> str:
        """sha256 of the whole file."""
        key = file_key(p)
        whole = (key, 0, key[2])
        if whole not in self._cache:
            self._cache[whole] = sha256_file(p)
        return self._cache[whole]

    def range(self, p: Path, start: int, end: int) -> str:
        """sha256 of bytes [start, end) of the file (the whole file's digest for [0, size))."""
        key = (file_key(p), start, end)
        if key not in self._cache:
            self._cache[key] = sha256_range(p, start, end)
        return self._cache[key]

    def files(
        self, paths: list[Path], hasher: Callable[[list[Path]], dict[Path, str]] | None = None
    ) -> dict[Path, str]:
        """sha256 of each path: from the cache when this version of it was hashed in this run, the rest
        through `hasher` (default: sha256_files, in parallel) and cached."""
        keys = {p: file_key(p) for p in paths}
        fresh = (hasher or sha256_files)([p for p in paths if (keys[p], 0, keys[p][2]) not in self._cache])
        for p, digest in fresh.items():
            self._cache[(keys[p], 0, keys[p][2])] = digest
        return {p: self._cache[(keys[p], 0, keys[p][2])] for p in paths}

    def folder(self, root: Path) -> dict[str, str]:
        """Relative POSIX path -> sha256 of every file under `root` (none when it is not a folder)."""
        if not root.is_dir():
            return {}
        paths = [p for p in sorted(root.rglob("*")) if p.is_file()]
        return {p.relative_to(root).as_posix(): d for p, d in self.files(paths).items()}


def self_digest(body: Mapping[str, Any], field: str) -> str:
    """The self digest of a self-hashed JSON body: sha256 of its canonical JSON without `field`."""
    return sha256_json({k: v for k, v in body.items() if k != field})


def seal(body: Mapping[str, Any], field: str) -> dict[str, Any]:
    """A copy of `body` with its self digest under `field`."""
    return {**body, field: self_digest(body, field)}


def is_sealed(body: Any, field: str) -> bool:
    """Does `body` (parsed JSON of any shape) carry a `field` equal to its own self digest?"""
    return isinstance(body, dict) and isinstance(body.get(field), str) and body[field] == self_digest(body, field)


def snapshot_root_digest(files: Iterable[Mapping[str, Any]]) -> str:
    """The fetch record's root digest: sha256 over the sorted `{sha256}  {path}\\n` lines."""
    lines = "".join(f"{f['sha256']}  {f['path']}\n" for f in sorted(files, key=lambda f: f["path"]))
    return hashlib.sha256(lines.encode()).hexdigest()


def artifact_root_digest(files: Iterable[Any], recipe_sha256: str) -> str:
    """The manifest's root digest (manifest schema_version 2): sha256 over the lines `{path}\0{sha256}\n`
    sorted by path (items with `.path` and `.sha256` attributes), then `recipe\0{recipe_sha256}\n`: the
    recipe serve launches from (its serve profiles: host, extra_args...) is pinned with the files.
    (schema_version 1 took the file lines alone.)"""
    h = hashlib.sha256()
    for f in sorted(files, key=lambda f: f.path):
        h.update(f"{f.path}\0{f.sha256}\n".encode())
    h.update(f"recipe\0{recipe_sha256}\n".encode())
    return h.hexdigest()
