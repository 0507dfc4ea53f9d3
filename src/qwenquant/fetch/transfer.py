"""Download one file at a pinned commit through huggingface_hub's HTTP session, hashing as bytes arrive.

The bytes go to a unique temporary name in the staging folder; only a file whose digest matches the
listing is renamed to its final path. Partials are named by content key, so an interrupted run's
partial is found and resumed (Range), and a resume whose prefix turns out wrong restarts from zero.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urljoin, urlparse

from qwenquant.errors import FetchError
from qwenquant.fetch.selection import RemoteFile

if TYPE_CHECKING:
    import httpx

log = logging.getLogger(__name__)

CHUNK = 1 << 20  # hashlib releases the GIL on buffers > 2 KiB, so hashing overlaps the network
PERMANENT_STATUS = {400, 401, 403, 404, 410, 451}


class Transient(Exception):
    """A failure worth retrying (5xx, reset, short body, wrong bytes, bad Content-Range)."""


class Cancelled(Exception):
    """Another file failed permanently; stop this one (its partial stays for the next run)."""


@dataclass
class FileDigest:
    path: str
    size: int
    sha256: str
    git_blob_id: str
    lfs: bool
    downloaded: int = 0  # bytes received over the network for it in this run


@dataclass
class Session:
    """What every transfer shares: the client's httpx session and where/what to fetch."""

    client: httpx.Client  # huggingface_hub.utils.get_session()
    headers: dict[str, str]
    endpoint: str
    repo_id: str
    repo_type: str
    commit: str
    attempts: int = 5
    backoff: float = 0.5
    cancel: threading.Event = field(default_factory=threading.Event)
    on_bytes: Callable[[int], None] | None = None


class _Hasher:
    """sha256 of the content, plus the git blob sha1 for files stored without LFS."""

    def __init__(self, f: RemoteFile) -> None:
        self.f = f
        self.reset()

    def reset(self) -> None:
        self.sha256 = hashlib.sha256()
        self.sha1 = None if self.f.lfs else hashlib.sha1(f"blob {self.f.size}\0".encode())

    def update(self, data: bytes | memoryview) -> None:
        self.sha256.update(data)
        if self.sha1 is not None:
            self.sha1.update(data)


_ACTIVE: set[Path] = set()  # partials being written by this process (two files may share content)
_ACTIVE_LOCK = threading.Lock()


def claim_partial(staging: Path, f: RemoteFile) -> Path:
    """Take over the largest partial of this content left by an earlier run (others are dropped)."""
    mine = staging / f"{f.key}.{uuid.uuid4().hex[:12]}.part"
    with _ACTIVE_LOCK:
        found = [p for p in staging.glob(f"{f.key}.*.part") if p not in _ACTIVE]
        found.sort(key=lambda p: p.stat().st_size, reverse=True)
        for i, p in enumerate(found):
            if i == 0 and p.stat().st_size <= f.size:
                with contextlib.suppress(FileNotFoundError):
                    os.replace(p, mine)
                    continue
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
        _ACTIVE.add(mine)
    return mine


def release_partial(path: Path) -> None:
    with _ACTIVE_LOCK:
        _ACTIVE.discard(path)


def download_file(s: Session, f: RemoteFile, staging: Path) -> tuple[Path, FileDigest]:
    """Fetch `f` into a verified temporary file in `staging`; return its path and digests."""
    tmp = claim_partial(staging, f)
    try:
        return _download_into(s, f, tmp)
    finally:
        release_partial(tmp)


def _download_into(s: Session, f: RemoteFile, tmp: Path) -> tuple[Path, FileDigest]:
    from huggingface_hub import hf_hub_url

    hasher = _Hasher(f)
    tmp.touch()
    with open(tmp, "r+b") as out:
        pos = 0
        while chunk := out.read(CHUNK):  # the prefix an earlier run left
            hasher.update(chunk)
            pos += len(chunk)
        resumed = pos > 0
        if resumed:
            log.info("resuming %s at byte %d of %d", f.path, pos, f.size)
            if s.on_bytes:
                s.on_bytes(pos)
        url = hf_hub_url(s.repo_id, f.path, repo_type=s.repo_type, revision=s.commit, endpoint=s.endpoint)
        received = [0]  # bytes that came over the network, across attempts
        failures: list[str] = []
        restarted = False
        while True:
            if s.cancel.is_set():
                raise Cancelled()
            restart = False
            try:
                if pos < f.size:
                    _stream(s, f, url, out, hasher, pos, received)
                sha256 = hasher.sha256.hexdigest()
                blob = hasher.sha1.hexdigest() if hasher.sha1 is not None else f.blob_id
                if (sha256 == f.sha256) if f.lfs else (blob == f.blob_id):
                    break
                what = f"sha256 {sha256}" if f.lfs else f"git blob sha1 {blob}"
                if resumed and not restarted:
                    log.warning("%s: %s after resuming a partial; restarting from zero", f.path, what)
                    restarted = restart = True
                else:
                    raise _Restart(f"{what} does not match the listing (same length, wrong bytes)")
            except Transient as e:
                failures.append(str(e))
                if len(failures) >= s.attempts:
                    raise FetchError(
                        f"{f.path}: failed {len(failures)} times, last: {e}",
                        hint="the server keeps failing or sending bad data; re-run later (verified files are kept)",
                    ) from None
                wait = min(s.backoff * 2 ** (len(failures) - 1), 8.0)
                log.warning("%s: %s; retry %d/%d in %.2fs", f.path, e, len(failures), s.attempts - 1, wait)
                time.sleep(wait)
                restart = isinstance(e, _Restart)
            if restart:  # drop the bytes and their hash
                if s.on_bytes and out.tell():
                    s.on_bytes(-out.tell())
                out.seek(0)
                out.truncate()
                hasher.reset()
            pos = out.tell()  # resume after what arrived (and was hashed)
        out.flush()
        os.fsync(out.fileno())
    return tmp, FileDigest(f.path, f.size, sha256, blob, f.lfs, received[0])


class _Restart(Transient):
    """A failure after which the bytes so far cannot be trusted: start again from byte 0."""


def _stream(s: Session, f: RemoteFile, url: str, out, hasher: _Hasher, pos: int, received: list[int]) -> None:
    """One GET from byte `pos` to the end, appended to `out` and hashed; counts bytes into `received`."""
    import httpx

    headers = dict(s.headers)
    headers["Accept-Encoding"] = "identity"
    if pos:
        headers["Range"] = f"bytes={pos}-"
    client = s.client
    try:
        target = url
        for _hop in range(5):  # resolve -> (302) -> blob
            with client.stream("GET", target, headers=headers, follow_redirects=False) as r:
                _check_commit(s, f, r)
                if r.is_redirect and "Location" in r.headers:
                    nxt = urljoin(target, r.headers["Location"])
                    if urlparse(nxt).hostname != urlparse(target).hostname:
                        headers.pop("authorization", None)  # never send the token to a CDN
                    target = nxt
                    continue
                _check_status(f, r)
                if r.status_code == 200 and pos:
                    log.info("%s: server ignored Range; downloading it whole", f.path)
                    if s.on_bytes:
                        s.on_bytes(-pos)
                    out.seek(0)
                    out.truncate()
                    hasher.reset()
                    pos = 0
                elif r.status_code == 206:
                    _check_content_range(f, r, pos)
                out.seek(pos)
                for chunk in r.iter_bytes():  # as received: nothing buffered is lost on a reset
                    if s.cancel.is_set():
                        raise Cancelled()
                    if pos + len(chunk) > f.size:
                        raise _Restart(f"server sent more than the listed {f.size} bytes")
                    out.write(chunk)
                    hasher.update(chunk)
                    pos += len(chunk)
                    received[0] += len(chunk)
                    if s.on_bytes:
                        s.on_bytes(len(chunk))
                if pos != f.size:
                    raise Transient(f"body ended at byte {pos} of {f.size}")
                return
        raise FetchError(f"{f.path}: too many redirects", hint="check HF_ENDPOINT")
    except httpx.TransportError as e:
        raise Transient(f"{type(e).__name__}: {e}") from None


def _check_commit(s: Session, f: RemoteFile, r) -> None:
    got = r.headers.get("X-Repo-Commit")
    if got is not None and got != s.commit:
        raise FetchError(
            f"{f.path}: server answered from commit {got}, not the pinned {s.commit}",
            hint="the repo changed under this run; re-run (same commit) or pass --re-resolve to take the new one",
        )


def _check_status(f: RemoteFile, r) -> None:
    if r.status_code in (200, 206):
        return
    code = r.headers.get("X-Error-Code")
    if r.status_code in PERMANENT_STATUS:
        what = {
            "RepoNotFound": "repository not found",
            "RevisionNotFound": "commit not found on the server (deleted or force-pushed?)",
            "EntryNotFound": "file not found at the pinned commit",
        }.get(code or "", f"HTTP {r.status_code}")
        hint = "pass --re-resolve to pin the branch's current commit" if code == "RevisionNotFound" else (
            "set HF_TOKEN or run `hf auth login`" if r.status_code in (401, 403) else "check the repo id and revision"
        )  # fmt: skip
        raise FetchError(f"{f.path}: {what} (HTTP {r.status_code})", hint=hint)
    if r.status_code == 416:
        raise Transient("server refused the Range (416)")
    raise Transient(f"HTTP {r.status_code}")


def _check_content_range(f: RemoteFile, r, pos: int) -> None:
    cr = r.headers.get("Content-Range", "")
    try:
        unit, rest = cr.split(" ", 1)
        span, total = rest.split("/")
        start = int(span.split("-")[0])
        ok = unit == "bytes" and start == pos and int(total) == f.size
    except ValueError:
        ok = False
    if not ok:
        raise _Restart(f"bad Content-Range {cr!r} for a request from byte {pos}")
