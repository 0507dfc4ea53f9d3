"""A loopback Hugging Face Hub: the HTTP subset the real huggingface_hub client needs.

Endpoints (models; datasets under /api/datasets/... and /datasets/{repo}/resolve/...):
  GET  /api/models/{repo}[/revision/{rev}]          repo info: sha, siblings
  GET  /api/models/{repo}/tree/{rev}[/{path}]       listing (recursive=, cursor pagination, Link)
  HEAD|GET /{repo}/resolve/{rev}/{path}             file, or 302 to /blobs/{sha256} for LFS
  HEAD|GET /blobs/{sha256}?path=...                 LFS blob ("CDN"), on a different host name
This is what the demo runs; the tests' hub (tests/support/hubserver) subclasses it with uploads, moving
branches, history rewrites and fault switches.
"""

from __future__ import annotations

import fnmatch
import logging
import socket
import threading
from pathlib import Path
from typing import Any

from qwenquant.testbed.hubserver.base import LoggedRequest
from qwenquant.testbed.hubserver.handler import _Handler, _QuietServer
from qwenquant.testbed.hubserver.repos import Commit, HubFile, Repo, commit_id, scan_folder

log = logging.getLogger(__name__)


class HubServer:
    """A real HTTP server on 127.0.0.1 serving local folders as Hub repos.

    with HubServer() as hub:
        commit = hub.add_repo("Qwen/Qwen3.8-27B", folder)
        ... endpoint=hub.url ...
        hub.requests  # what was asked
    """

    handler_class: type[_Handler] = _Handler

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, cdn_host: str | None = "localhost",
                 tree_page_size: int = 1000) -> None:  # fmt: skip
        self.host = host
        self._port = port
        self.tree_page_size = tree_page_size
        self.requests: list[LoggedRequest] = []
        self._repos: dict[tuple[str, str], Repo] = {}
        self._lock = threading.RLock()
        self._count = 0
        self._httpd: _QuietServer | None = None
        self._thread: threading.Thread | None = None
        # A different host name for blobs makes the client treat them like the Hub's CDN
        # (HEAD stops at the 302 and reads X-Linked-Etag/X-Linked-Size from it).
        self.cdn_host = cdn_host if cdn_host and _resolves_to(cdn_host, host) else host

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> HubServer:
        handler = type("Handler", (self.handler_class,), {"hub": self})
        self._httpd = _QuietServer((self.host, self._port), handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), name="hubserver", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("server not started")
        return self._httpd.server_address[1]

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # -- content ---------------------------------------------------------------------------
    def add_repo(self, repo_id: str, folder: Path, *, branch: str = "main", repo_type: str = "model") -> str:
        """Serve `folder` as `repo_id` with `branch` pointing at a new commit; return the commit id."""
        return self.add_commit(repo_id, folder, branch=branch, repo_type=repo_type)

    def add_commit(self, repo_id: str, folder: Path, *, branch: str | None = None, repo_type: str = "model") -> str:
        """Add a commit with `folder`'s content (parent: the branch head); move `branch` to it if given."""
        files = scan_folder(Path(folder))
        with self._lock:
            repo = self._repos.setdefault((repo_type, repo_id), Repo(repo_id, repo_type))
            parent = repo.branches.get(branch or "main")
            sha = commit_id(files, parent)
            repo.commits[sha] = Commit(sha, files)
            if branch is not None:
                repo.branches[branch] = sha
        return sha

    def repo(self, repo_id: str, repo_type: str = "model") -> Repo | None:
        """The repo as the server holds it (commits, branches), or None."""
        with self._lock:
            return self._repos.get((repo_type, repo_id))

    def branch(self, repo_id: str, branch: str = "main", repo_type: str = "model") -> str:
        with self._lock:
            return self._repos[(repo_type, repo_id)].branches[branch]

    def file(self, repo_id: str, path: str, revision: str = "main", repo_type: str = "model") -> HubFile:
        with self._lock:
            commit = self._resolve_commit(self._repos[(repo_type, repo_id)], revision)
            if commit is None:
                raise KeyError(f"{repo_id} has no revision {revision}")
            return commit.files[path]

    # -- request log -----------------------------------------------------------------------
    def downloads(self, path_glob: str = "*") -> list[LoggedRequest]:
        """GET requests that sent file bytes (resolve of small files, blobs of LFS files)."""
        with self._lock:
            return [
                r for r in self.requests
                if r.method == "GET" and r.endpoint in ("resolve", "blob") and r.file is not None
                and r.start is not None and fnmatch.fnmatchcase(r.file, path_glob)
            ]  # fmt: skip

    def clear_log(self) -> None:
        with self._lock:
            self.requests.clear()

    # -- internals used by the handler -----------------------------------------------------
    def _tick(self, rec: LoggedRequest) -> None:
        """Every request, logged as it arrives."""
        with self._lock:
            self._count += 1
            self.requests.append(rec)

    def _find_repo(self, repo_type: str, parts: list[str]) -> tuple[Repo | None, list[str]]:
        """Split url segments into a known repo id (1 or 2 segments) and the rest."""
        with self._lock:
            for n in (2, 1):
                repo = self._repos.get((repo_type, "/".join(parts[:n])))
                if repo is not None and len(parts) >= n:
                    return repo, parts[n:]
        return None, parts[2:] if len(parts) > 2 else []

    def _resolve_commit(self, repo: Repo, revision: str) -> Commit | None:
        with self._lock:
            sha = repo.branches.get(revision, revision)
            return repo.commits.get(sha)

    def _blob(self, sha256: str) -> HubFile | None:
        with self._lock:
            for repo in self._repos.values():
                for c in repo.commits.values():
                    for f in c.files.values():
                        if f.sha256 == sha256 and f.lfs:
                            return f
        return None


def _resolves_to(name: str, host: str) -> bool:
    try:
        return all(a[4][0] == host for a in socket.getaddrinfo(name, 80, socket.AF_UNSPEC, socket.SOCK_STREAM))
    except OSError:
        return False
