"""The tests' hub: the demo's HubServer with fault switches, uploads into a store folder, branches moved
after N requests and history rewrites (squash)."""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path

from qwenquant.testbed.hubserver.base import LoggedRequest
from qwenquant.testbed.hubserver.server import HubServer as DownloadHub

from support.hubserver import store as storemod
from support.hubserver.faults import FaultSet
from support.hubserver.handler import FaultyHandler

log = logging.getLogger(__name__)


class HubServer(DownloadHub):
    """`hub.faults.add(Fault(...))`, `hub.move_branch(...)`, `hub.squash(...)`; uploads land in `hub.store`."""

    handler_class = FaultyHandler

    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, *, cdn_host: str | None = "localhost", tree_page_size: int = 1000
    ) -> None:
        super().__init__(host, port, cdn_host=cdn_host, tree_page_size=tree_page_size)
        self.faults = FaultSet()
        self._scheduled: list[tuple[int, str, str, str, str, bool]] = []
        self.store = Path(tempfile.mkdtemp(prefix="qwenquant-hub-"))  # uploaded bytes, by sha256
        self._squashes = 0

    def stop(self) -> None:
        super().stop()
        shutil.rmtree(self.store, ignore_errors=True)

    def move_branch(
        self,
        repo_id: str,
        branch: str,
        commit: str,
        *,
        after_requests: int | None = None,
        drop_old: bool = False,
        repo_type: str = "model",
    ) -> None:
        """Point `branch` at `commit`, now or once the server has seen `after_requests` more requests.

        `drop_old` also deletes the commit the branch pointed to (a force-push plus gc).
        """
        with self._lock:
            if after_requests is None:
                self._move(repo_type, repo_id, branch, commit, drop_old)
            else:
                self._scheduled.append((self._count + after_requests, repo_type, repo_id, branch, commit, drop_old))

    def _move(self, repo_type: str, repo_id: str, branch: str, commit: str, drop_old: bool) -> None:
        repo = self._repos[(repo_type, repo_id)]
        if commit not in repo.commits:
            raise KeyError(f"unknown commit {commit}")
        old = repo.branches.get(branch)
        repo.branches[branch] = commit
        if drop_old and old and old != commit:
            repo.commits.pop(old, None)
        log.debug("moved %s@%s %s -> %s", repo_id, branch, old, commit)

    def squash(
        self, repo_id: str, *, change: str | None = None, at: int | None = None, repo_type: str = "model"
    ) -> dict[str, str]:
        """Rewrite `repo_id`'s history (a squash and gc): each branch one new commit with the same
        files (`change`: that file's byte `at` flipped), every old commit gone. Returns branch -> commit."""
        with self._lock:
            self._squashes += 1
            return storemod.squash(self._repos[(repo_type, repo_id)], self.store, self._squashes, change, at)

    def _tick(self, rec: LoggedRequest) -> None:
        with self._lock:
            super()._tick(rec)
            due = [s for s in self._scheduled if s[0] <= self._count]
            self._scheduled = [s for s in self._scheduled if s[0] > self._count]
            for _, rtype, rid, br, commit, drop in due:
                self._move(rtype, rid, br, commit, drop)
            for fault in self.faults.take_squash():
                for rtype, rid in list(self._repos):
                    if fault.repo in (None, rid):
                        self.squash(rid, change=fault.path, at=fault.at, repo_type=rtype)
                        rec.faults.append("squash")

    def _create_repo(self, repo_id: str, repo_type: str, private: bool) -> bool:
        """Create an empty repo (its .gitattributes commit); False when it exists (uploads.py)."""
        with self._lock:
            if (repo_type, repo_id) in self._repos:
                return False
            self._repos[(repo_type, repo_id)] = storemod.new_repo(repo_id, repo_type, private, self.store)
            return True
