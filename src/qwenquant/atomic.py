"""Never leave a half-written file where a complete one is expected."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any


def canonical_json(obj: Any) -> bytes:
    """Canonical JSON: sorted keys, fixed separators, UTF-8, trailing newline."""
    return (json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False) + "\n").encode()


def pretty_json(obj: Any) -> bytes:
    """Human-readable JSON with sorted keys (for configs a user may open)."""
    return (json.dumps(obj, sort_keys=True, indent=2, ensure_ascii=False) + "\n").encode()


def _unique_name(folder: Path, name: str, suffix: str) -> Path:
    return folder / f".{name}.{secrets.token_hex(6)}{suffix}"


def _create_file(folder: Path, name: str) -> tuple[int, Path]:
    """A new file at a unique name in `folder`, opened for writing, with the mode a plain `open(path, "w")`
    gives: os.open's mode 0o666, less the umask, applied by the kernel. The process-wide umask is never
    read by setting it (mkstemp's 0600 would need it, and flipping it races with threads that write)."""
    while True:
        tmp = _unique_name(folder, name, ".tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666), tmp
        except FileExistsError:
            continue


def _create_folder(folder: Path, name: str) -> Path:
    """A new folder at a unique name in `folder`, mode 0o777 less the umask (mkdtemp makes 0700)."""
    while True:
        tmp = _unique_name(folder, name, ".partial")
        try:
            os.mkdir(tmp, 0o777)
            return tmp
        except FileExistsError:
            continue


def fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def atomic_writer(path: Path) -> Iterator[IO[bytes]]:
    """A binary file at a unique temporary name beside `path`; on success fsync it and rename it
    over `path`, on any exception remove it (`path` is never half-written). A `path` that exists and
    is not a regular file (a device such as /dev/null, a FIFO) is written through, never replaced."""
    path = Path(path)
    if path.exists() and not path.is_file() and not path.is_dir():
        with open(path, "wb") as f:
            yield f
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _create_file(path.parent, path.name)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to a unique temporary name beside `path`, fsync, then rename over `path`."""
    with atomic_writer(path) as f:
        f.write(data)


def atomic_write_json(path: Path, obj: Any, *, canonical: bool = True) -> None:
    atomic_write_bytes(path, canonical_json(obj) if canonical else pretty_json(obj))


@contextlib.contextmanager
def staging_dir(final: Path) -> Iterator[Path]:
    """Yield a fresh temporary folder beside `final`; on success it replaces `final` whole.

    On any exception (in the block, or in the final rename: a read-only or busy `final`) the
    temporary folder is removed and `final` is left as it was.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = _create_folder(final.parent, final.name)
    try:
        yield tmp
        replace_dir(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def replace_dir(src: Path, final: Path) -> None:
    """Move folder `src` to `final`, replacing any old `final` (moved aside first, then deleted; moved
    back when `src` cannot take its place)."""
    old = None
    if final.exists():
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    try:
        os.replace(src, final)
    except BaseException:
        if old is not None:
            os.replace(old, final)
        raise
    fsync_dir(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def exclusive_lock(path: Path, busy: Exception) -> Iterator[None]:
    """Hold an exclusive flock on `path` (the kernel releases it if the process dies); raise
    `busy` at once when another process holds it."""
    import fcntl

    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise busy from None
        yield
    finally:
        os.close(fd)


def writable_folder(folder: Path, what: str, option: str) -> None:
    """Create and remove a scratch file in `folder`; a UsageError naming `what` when that fails (a
    read-only mount, a full disk, no permission: the real test, for root too)."""
    from qwenquant.errors import UsageError

    try:
        fd, scratch = tempfile.mkstemp(dir=folder, prefix=".qwenquant-write-test-")
        os.close(fd)
        os.unlink(scratch)
    except OSError as e:
        raise UsageError(
            f"{what}: cannot write in {folder} ({e.strerror or e})", hint=f"pass {option} in a folder you can write"
        ) from None
