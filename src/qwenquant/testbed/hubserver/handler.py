"""The download routes of the loopback hub (HEAD, GET). Writes (POST, PUT) answer 405 here; the tests' hub
(tests/support/hubserver) adds uploads and fault switches by overriding `do_POST`/`do_PUT`, `faults` and
`_send_file`."""

from __future__ import annotations

from http.server import ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

from qwenquant.testbed.hubserver.base import BaseHandler, LoggedRequest, _Stop
from qwenquant.testbed.hubserver.repos import HubFile, Repo, commit_id

DATE = "2026-11-29T00:00:00.000Z"


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):  # resets are part of the game
            super().handle_error(request, client_address)


class _Handler(BaseHandler):
    """Downloads (HEAD, GET) are routed here; the demo's hub takes no writes."""

    # what a fault switch may change (the tests' hub fires them; this one never does)
    BODY_KINDS: frozenset[str] = frozenset()

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._refuse_write("POST")

    def do_PUT(self) -> None:
        self._refuse_write("PUT")

    def _refuse_write(self, method: str) -> None:
        self._rec = LoggedRequest(method=method, path=urlsplit(self.path).path, endpoint="unknown")
        self.hub._tick(self._rec)
        self._error(405, None, "this hub serves downloads only")

    def faults(self, kinds: set[str] | frozenset[str], *, repo_id: str, path: str, method: str) -> dict[str, Any]:
        """The fault switches of `kinds` that fire on this request, by kind: none on this hub."""
        return {}

    # -- routing ---------------------------------------------------------------------------
    def _dispatch(self, method: str) -> None:
        url = urlsplit(self.path)
        rec = LoggedRequest(method=method, path=url.path, endpoint="unknown", range=self.headers.get("Range"),
                            host=(self.headers.get("Host") or "").rsplit(":", 1)[0] or None,
                            authorized="Authorization" in self.headers)  # fmt: skip
        self.hub._tick(rec)
        self._rec = rec
        query = parse_qs(url.query)
        parts = [unquote(p) for p in url.path.strip("/").split("/")]
        try:
            if parts[:1] == ["api"] and len(parts) >= 3 and parts[1] in ("models", "datasets"):
                self._api(method, parts[1][:-1], parts[2:], query)
            elif parts[:1] == ["blobs"] and len(parts) == 2:
                self._serve_blob(method, parts[1], query)
            elif "resolve" in parts:
                rtype = "dataset" if parts[0] == "datasets" else "model"
                self._resolve(method, rtype, parts[1:] if rtype == "dataset" else parts)
            else:
                self._error(404, "NotFound", f"no route for {url.path}")
        except _Stop:
            self.close_connection = True
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _api(self, method: str, rtype: str, parts: list[str], query: dict[str, list[str]]) -> None:
        repo, rest = self.hub._find_repo(rtype, parts)
        rec = self._rec
        rec.endpoint = "tree" if rest[:1] == ["tree"] else "info"
        if repo is None or (repo.private and not rec.authorized):
            return self._error(401 if repo else 404, "RepoNotFound", "Repository not found")
        rec.repo_id = repo.repo_id
        fired = self.faults({"fail"}, repo_id=repo.repo_id, path="/api", method=method)
        if fired:
            return self._fail(fired["fail"])
        if rest[:1] == ["tree"] and len(rest) >= 2:
            return self._tree(repo, rest[1], "/".join(rest[2:]), query)
        if rest and not (rest[0] == "revision" and len(rest) == 2):
            return self._error(404, "NotFound", "unknown api route")
        revision = rest[1] if rest else "main"
        rec.revision = revision
        commit = self.hub._resolve_commit(repo, revision)
        if commit is None:
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        blobs = query.get("blobs", ["false"])[0].lower() == "true"
        siblings = []
        for f in sorted(commit.files.values(), key=lambda f: f.path):
            s: dict[str, Any] = {"rfilename": f.path}
            if blobs:
                s.update(size=f.size, blobId=f.blob_id)
                if f.lfs:
                    s["lfs"] = {"sha256": f.sha256, "size": f.size, "pointerSize": f.pointer_size}
            siblings.append(s)
        body = {
            "_id": commit.sha[:24], "id": repo.repo_id, "sha": commit.sha, "lastModified": DATE, "createdAt": DATE,
            "private": repo.private, "disabled": False, "gated": False, "tags": [], "downloads": 0, "likes": 0,
            "siblings": siblings,
        }  # fmt: skip
        if rtype == "model":
            body["modelId"] = repo.repo_id
        self._json(200, body, commit.sha)

    def _tree(self, repo: Repo, revision: str, prefix: str, query: dict[str, list[str]]) -> None:
        self._rec.revision = revision
        commit = self.hub._resolve_commit(repo, revision)
        if commit is None:
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        recursive = query.get("recursive", ["false"])[0].lower() == "true"
        expand = query.get("expand", ["false"])[0].lower() == "true"
        prefix = prefix.strip("/")
        entries: dict[str, dict[str, Any]] = {}
        for f in commit.files.values():
            if prefix and not f.path.startswith(prefix + "/"):
                continue
            rel = f.path[len(prefix) + 1 :] if prefix else f.path
            segs = rel.split("/")
            base = f"{prefix}/" if prefix else ""
            for i in range(1, len(segs)):  # the folders above the file
                d = base + "/".join(segs[:i])
                if recursive or i == 1:
                    entries.setdefault(d, {"type": "directory", "oid": commit_id({}, d), "size": 0, "path": d})
            if recursive or len(segs) == 1:
                e: dict[str, Any] = {"type": "file", "oid": f.blob_id, "size": f.size, "path": f.path}
                if f.lfs:
                    e["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": f.pointer_size}
                entries[f.path] = e
        if prefix and not entries:
            return self._error(404, "EntryNotFound", f"{prefix} does not exist on {revision}", commit.sha)
        listing = [entries[k] for k in sorted(entries)]
        if expand:
            for e in listing:
                e["lastCommit"] = {"id": commit.sha, "title": commit.title, "date": DATE}
        start = int(query.get("cursor", ["0"])[0])
        page = listing[start : start + self.hub.tree_page_size]
        links = None
        if start + self.hub.tree_page_size < len(listing):
            host = self.headers.get("Host", f"{self.hub.host}:{self.hub.port}")
            params = "&".join(f"{k}={quote(v[0])}" for k, v in query.items() if k != "cursor")
            nxt = f"http://{host}{self._rec.path}?{params}&cursor={start + self.hub.tree_page_size}"
            links = f'<{nxt}>; rel="next"'
        self._json(200, page, commit.sha, extra={"Link": links} if links else None)

    def _resolve(self, method: str, rtype: str, parts: list[str]) -> None:
        rec = self._rec
        rec.endpoint = "resolve"
        i = parts.index("resolve")
        repo_parts, rest = parts[:i], parts[i + 1 :]
        repo = self.hub._repos.get((rtype, "/".join(repo_parts)))
        if repo is None or not rest or (repo.private and not rec.authorized):
            return self._error(401 if repo else 404, "RepoNotFound", "Repository not found")
        revision, path = rest[0], "/".join(rest[1:])
        rec.repo_id, rec.revision, rec.file = repo.repo_id, revision, path
        commit = self.hub._resolve_commit(repo, revision)
        if commit is None:
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        kinds = {"fail", "not_found", "wrong_commit"}
        f = commit.files.get(path)
        if f is not None and not f.lfs:
            kinds |= self.BODY_KINDS
        fired = self.faults(kinds, repo_id=repo.repo_id, path=path, method=method)
        rec.faults = sorted(fired)
        reported = (fired["wrong_commit"].commit or "f" * 40) if "wrong_commit" in fired else commit.sha
        if "fail" in fired:
            return self._fail(fired["fail"], reported)
        if f is None or "not_found" in fired:
            return self._error(404, "EntryNotFound", f"{path} does not exist on {revision}", reported)
        if f.lfs:
            host = self.headers.get("Host", "").rsplit(":", 1)[0] or self.hub.host
            cdn = self.hub.cdn_host if host == self.hub.host else host
            loc = f"http://{cdn}:{self.hub.port}/blobs/{f.sha256}?path={quote(path)}&commit={commit.sha}"
            self.send_response(302)
            self.send_header("Location", loc)
            self.send_header("X-Repo-Commit", reported)
            self.send_header("ETag", f'"{f.blob_id}"')
            self.send_header("X-Linked-Etag", f'"{f.sha256}"')
            self.send_header("X-Linked-Size", str(f.size))
            self.send_header("Content-Length", "0")
            self.end_headers()
            rec.status = 302
            return
        self._send_file(method, f, {"X-Repo-Commit": reported, "ETag": f'"{f.blob_id}"'}, fired)

    def _serve_blob(self, method: str, sha256: str, query: dict[str, list[str]]) -> None:
        rec = self._rec
        rec.endpoint = "blob"
        f = self.hub._blob(sha256)
        if f is None:
            return self._error(404, "EntryNotFound", "blob not found")
        rec.file = query.get("path", [f.path])[0]
        fired = self.faults(self.BODY_KINDS | {"fail"}, repo_id="", path=rec.file, method=method)
        rec.faults = sorted(fired)
        if "fail" in fired:
            return self._fail(fired["fail"])
        self._send_file(method, f, {"ETag": f'"{f.sha256}"'}, fired)

    # -- responses -------------------------------------------------------------------------
    def _send_file(self, method: str, f: HubFile, headers: dict[str, str], fired: dict[str, Any]) -> None:
        """The file (or the Range asked for) with `headers`; `fired`: the faults of this request (none here)."""
        span = self._send_headers(f, headers, ignore_range=False, shift=0)
        if span is None or method == "HEAD":
            return
        start, end = span
        with open(f.source, "rb") as src:
            self._rec.sent = self.connection.sendfile(src, start, end - start) if end > start else 0

    def _send_headers(
        self, f: HubFile, headers: dict[str, str], *, ignore_range: bool, shift: int
    ) -> tuple[int, int] | None:
        """The status line and headers of `f` (206 for a satisfiable Range unless `ignore_range`; its start
        moved `shift` bytes on); the body's [start, end), or None after a 416."""
        rec = self._rec
        size = f.size
        start, end, status = 0, size, 200
        if rec.range and not ignore_range:
            span = _parse_range(rec.range, size)
            if span is None:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                rec.status = 416
                return None
            start, end, status = min(span[0] + shift, span[1]), span[1], 206
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(end - start))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        self.end_headers()
        rec.status, rec.start, rec.end = status, start, end
        return start, end

    def _fail(self, fault: Any, commit: str | None = None) -> None:
        self._rec.faults = ["fail"]
        self._error(fault.status, None, f"injected {fault.status}", commit)


def _parse_range(header: str, size: int) -> tuple[int, int] | None:
    """`bytes=a-b` / `bytes=a-` / `bytes=-n` -> [start, end) or None when unsatisfiable."""
    try:
        unit, spec = header.split("=", 1)
        if unit.strip() != "bytes" or "," in spec:
            return None
        a, b = spec.strip().split("-", 1)
        if a == "":
            n = int(b)
            return (max(0, size - n), size) if n > 0 and size > 0 else None
        start = int(a)
        end = min(size, int(b) + 1) if b else size
    except ValueError:
        return None
    return (start, end) if 0 <= start < end else None
