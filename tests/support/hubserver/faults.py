"""Fault switches for the loopback hub, settable from tests (per path or global, with counts)."""

from __future__ import annotations

import fnmatch
import threading
from dataclasses import dataclass, field

# kind -> what the server does to a matching request
KINDS = {
    "fail": "answer with `status` (500/503/...) instead of the file",
    "not_found": "answer 404 EntryNotFound as if the file did not exist",
    "truncate": "send the headers of the full body but stop after byte `at` and close (FIN)",
    "close": "reset the connection (RST) after byte `at` of the body",
    "corrupt": "send the same length, with the byte at offset `at` flipped",
    "ignore_range": "ignore a Range header: answer 200 with the whole file",
    "bad_content_range": "answer a Range request with a 206 whose Content-Range starts `shift` bytes later",
    "slow": "stream the body at `rate` bytes/s",
    "wrong_commit": "answer resolve requests with X-Repo-Commit `commit` (another commit)",
    "upload_fail": "answer an upload endpoint (`path`: create, validate-yaml, preupload, branch, lfs-batch, "
    "lfs-put/<sha256>, lfs-verify, commit) with `status` and Retry-After: 0, changing nothing",
    "upload_cut": "stop reading an LFS PUT (`path` lfs-put/<sha256>) after byte `at` of its body (default: half) "
    "and drop the connection; nothing is stored",
    "squash": "before the next request, rewrite `repo`'s history (every repo's without it): each branch becomes one "
    "new commit with the same files, old commits answer 404; with `path`, that file's byte `at` flipped",
}
BODY_KINDS = {"truncate", "close", "corrupt", "ignore_range", "bad_content_range", "slow"}
UPLOAD_KINDS = {"upload_fail", "upload_cut"}  # matched on the endpoint name, any method


@dataclass
class Fault:
    """One fault switch. `path` is an fnmatch pattern on the repo file path (None: every file).

    `times` is how many matching requests it applies to (None: forever); `skip` lets that many
    matching requests pass first. `hits` counts how often it fired.
    """

    kind: str
    path: str | None = None
    times: int | None = 1
    skip: int = 0
    status: int = 503
    at: int | None = None
    shift: int = 1
    rate: int = 1 << 20
    commit: str | None = None
    repo: str | None = None
    method: str | None = "GET"  # None: GET and HEAD
    hits: int = field(default=0, compare=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}; one of {', '.join(KINDS)}")


class FaultSet:
    """The active faults of a server; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._faults: list[Fault] = []

    def add(self, fault: Fault) -> Fault:
        with self._lock:
            self._faults.append(fault)
        return fault

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()

    def __iter__(self):
        with self._lock:
            return iter(list(self._faults))

    def take(self, kinds: set[str], *, repo_id: str, path: str, method: str, has_range: bool) -> list[Fault]:
        """Consume and return the faults that fire for this request (one per kind at most)."""
        fired: list[Fault] = []
        with self._lock:
            for f in self._faults:
                if f.kind not in kinds or any(g.kind == f.kind for g in fired):
                    continue
                if f.repo is not None and f.repo != repo_id:
                    continue
                if f.path is not None and not fnmatch.fnmatchcase(path, f.path):
                    continue
                if f.method is not None and f.method != method and f.kind not in UPLOAD_KINDS:
                    continue
                if f.kind in ("ignore_range", "bad_content_range") and not has_range:
                    continue
                if _consume(f):
                    fired.append(f)
        return fired

    def take_squash(self) -> list[Fault]:
        """Consume the squash faults that fire before this request (they match no path)."""
        with self._lock:
            return [f for f in self._faults if f.kind == "squash" and _consume(f)]


def _consume(f: Fault) -> bool:
    """Count one matching request against `f`: True when it fires (times left, nothing to skip)."""
    if f.times is not None and f.times <= 0:
        return False
    if f.skip > 0:
        f.skip -= 1
        return False
    if f.times is not None:
        f.times -= 1
    f.hits += 1
    return True
