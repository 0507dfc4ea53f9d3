"""File digests: sha256 (LFS, manifests) and git blob sha1 (small Hub files), hashed in parallel."""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterable

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


def sha256_json(obj: Any) -> str:
    """Hex sha256 of the canonical JSON of `obj` (sorted keys, fixed separators)."""
    return hashlib.sha256(canonical_json(obj)).hexdigest()


def git_blob_sha1(path: Path) -> str:
    """The git blob id of a file: sha1(b"blob <size>\\0" + content)."""
    size = os.path.getsize(path)
    h = hashlib.sha1()
    h.update(f"blob {size}\0".encode())
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def git_blob_sha1_bytes(data: bytes) -> str:
    return hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()


def sha256_files(
    paths: Iterable[Path], progress: Callable[[int], None] | None = None, workers: int | None = None
) -> dict[Path, str]:
    """sha256 of many files at once, on a thread pool."""
    paths = list(paths)
    workers = workers or min(8, (os.cpu_count() or 2) * 2)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        digests = list(pool.map(lambda p: sha256_file(p, progress), paths))
    return dict(zip(paths, digests))
