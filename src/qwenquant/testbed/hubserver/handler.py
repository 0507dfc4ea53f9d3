"""The download routes of the loopback hub (HEAD, GET) with fault injection; uploads.py has the writes."""

from __future__ import annotations

import socket
import struct
import time
from http.server import ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

from qwenquant.testbed.hubserver.base import BaseHandler, LoggedRequest, _Stop
from qwenquant.testbed.hubserver.faults import BODY_KINDS, Fault
from qwenquant.testbed.hubserver.repos import HubFile, Repo, commit_id
from qwenquant.testbed.hubserver.uploads import handle as handle_upload

DATE = "2026-11-29T00:00:00.000Z"


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):  # resets are part of the game
            super().handle_error(request, client_address)


class _Handler(BaseHandler):
    """Downloads (HEAD, GET) are routed here; writes (POST, PUT) by uploads.py."""

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        handle_upload(self, "POST")

    def do_PUT(self) -> None:
        handle_upload(self, "PUT")

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
        fired = self.hub.faults.take({"fail"}, repo_id=repo.repo_id, path="/api", method=method, has_range=False)
        if fired:
            return self._fail(fired[0])
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
            kinds |= BODY_KINDS
        fired = {x.kind: x for x in self.hub.faults.take(
            kinds, repo_id=repo.repo_id, path=path, method=method, has_range=bool(rec.range))}  # fmt: skip
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
        fired = {x.kind: x for x in self.hub.faults.take(
            BODY_KINDS | {"fail"}, repo_id="", path=rec.file, method=method, has_range=bool(rec.range))}  # fmt: skip
        rec.faults = sorted(fired)
        if "fail" in fired:
            return self._fail(fired["fail"])
        self._send_file(method, f, {"ETag": f'"{f.sha256}"'}, fired)

    # -- responses -------------------------------------------------------------------------
    def _send_file(self, method: str, f: HubFile, headers: dict[str, str], fired: dict[str, Fault]) -> None:
        rec = self._rec
        size = f.size
        start, end, status = 0, size, 200
        if rec.range and "ignore_range" not in fired:
            span = _parse_range(rec.range, size)
            if span is None:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                rec.status = 416
                return
            start, end, status = span[0], span[1], 206
            if "bad_content_range" in fired:
                start = min(start + fired["bad_content_range"].shift, end)
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(end - start))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        self.end_headers()
        rec.status, rec.start, rec.end = status, start, end
        if method == "HEAD":
            return
        stop_at = end
        for kind in ("truncate", "close"):
            if kind in fired:
                at = fired[kind].at
                stop_at = min(end, max(start, at if at is not None else start + (end - start) // 2))
        flip = None
        if "corrupt" in fired:
            at = fired["corrupt"].at
            flip = min(max(start, at if at is not None else size // 2), end - 1)
        rate = fired["slow"].rate if "slow" in fired else None
        with open(f.source, "rb") as src:
            if flip is None and rate is None and stop_at == end:
                rec.sent = self.connection.sendfile(src, start, end - start) if end > start else 0
                return
            src.seek(start)
            pos = start
            t0 = time.monotonic()
            step = max(1, min(1 << 20, rate // 10)) if rate else 1 << 20
            while pos < stop_at:
                chunk = bytearray(src.read(min(step, stop_at - pos)))
                if not chunk:
                    break
                if flip is not None and pos <= flip < pos + len(chunk):
                    chunk[flip - pos] ^= 0xFF
                self.wfile.write(chunk)
                pos += len(chunk)
                rec.sent = pos - start
                if rate:
                    ahead = (pos - start) / rate - (time.monotonic() - t0)
                    if ahead > 0:
                        time.sleep(ahead)
        if stop_at < end:
            if "close" in fired:  # RST instead of FIN: the client sees "connection reset"
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            raise _Stop()

    def _fail(self, fault: Fault, commit: str | None = None) -> None:
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
