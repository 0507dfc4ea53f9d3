"""The upload routes of the loopback hub: what huggingface_hub sends with Xet off (HF_HUB_DISABLE_XET=1).

  POST /api/repos/create                                {name, organization, type, visibility}
  POST /api/validate-yaml                               README.md front matter
  POST /api/{type}s/{repo}/preupload/{rev}              upload mode per file (lfs | regular), remote oid
  POST /api/{type}s/{repo}/branch/{branch}              a branch at the head of `startingPoint` (main)
  POST /[datasets/]{repo}.git/info/lfs/objects/batch    basic transfer: a PUT href and a verify href per object
  PUT  /lfs-upload/{type}/{repo}/{oid}                  the object's bytes ("S3", on the CDN host name, no token)
  POST /[datasets/]{repo}.git/info/lfs/objects/verify   {oid, size}
  POST /api/{type}s/{repo}/commit/{rev}                 ndjson: header, file (base64), lfsFile, deletedFile/Folder

Write routes need an Authorization header (the PUT href is presigned). Faults: `upload_fail` by endpoint
name (`lfs-put/<sha256>` for one object's PUT), `upload_cut` on a PUT body.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import struct
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote, urlsplit

from qwenquant.testbed.hubserver.base import BaseHandler, LoggedRequest, _Stop

from support.hubserver import store as storemod

NO_AUTH = {"validate-yaml", "lfs-put"}


def handle(h: BaseHandler, method: str) -> None:
    """Route one POST or PUT; every outcome is one logged request."""
    url = urlsplit(h.path)
    rec = LoggedRequest(method=method, path=url.path, endpoint="unknown",
                        host=(h.headers.get("Host") or "").rsplit(":", 1)[0] or None,
                        authorized="Authorization" in h.headers)  # fmt: skip
    h.hub._tick(rec)
    h._rec = rec
    parts = [unquote(p) for p in url.path.strip("/").split("/")]
    try:
        route = _route(h, method, parts)
        if route is None:
            _drain(h)
            return h._error(404, "NotFound", f"no route for {method} {url.path}")
        name, repo, rest = route
        rec.endpoint = name
        rec.repo_id = repo.repo_id if repo is not None else None
        if name not in NO_AUTH and not rec.authorized:
            _drain(h)
            return h._error(401, None, "Invalid credentials in Authorization header")
        where = f"{name}/{rest[0]}" if name == "lfs-put" else name  # an LFS PUT matches lfs-put/<sha256>
        fired = {f.kind: f for f in h.hub.faults.take({"upload_fail", "upload_cut"}, repo_id=rec.repo_id or "",
                                                      path=where, method=method, has_range=False)}  # fmt: skip
        rec.faults = sorted(fired)
        if "upload_fail" in fired:
            _drain(h)
            status = fired["upload_fail"].status  # with Retry-After: 0, as the Hub's 503s: the client retries in 1 s
            return h._json(status, {"error": f"injected {status}"}, extra={"Retry-After": "0"})
        if name == "lfs-put":
            return _put(h, repo, rest[0], fired.get("upload_cut"))
        ROUTES[name](h, repo, rest, _json_body(h) if name != "commit" else _lines(h))
    except _Stop:
        h.close_connection = True
    except (BrokenPipeError, ConnectionResetError):
        h.close_connection = True


def _route(h: BaseHandler, method: str, parts: list[str]) -> tuple[str, Any, list[str]] | None:
    """(endpoint name, repo or None, the segments after the repo id) of a write request."""
    if method == "PUT":
        if parts[:1] == ["lfs-upload"] and len(parts) >= 4:
            repo = h.hub._repos.get((parts[1], "/".join(parts[2:-1])))
            return ("lfs-put", repo, parts[-1:]) if repo is not None else None
        return None
    if parts == ["api", "repos", "create"]:
        return "create", None, []
    if parts == ["api", "validate-yaml"]:
        return "validate-yaml", None, []
    if parts[:1] == ["api"] and len(parts) >= 4 and parts[1] in ("models", "datasets"):
        repo, rest = h.hub._find_repo(parts[1][:-1], parts[2:])
        if repo is not None and len(rest) >= 2 and rest[0] in ("preupload", "commit", "branch"):
            return rest[0], repo, ["/".join(rest[1:])]
        return None
    rtype = "dataset" if parts[:1] == ["datasets"] else "model"
    tail = parts[1:] if rtype == "dataset" else parts
    if len(tail) >= 5 and tail[-4:-1] == ["info", "lfs", "objects"] and tail[-5].endswith(".git"):
        repo_id = "/".join(tail[:-4])[: -len(".git")]
        repo = h.hub._repos.get((rtype, repo_id))
        if repo is not None and tail[-1] in ("batch", "verify"):
            return f"lfs-{tail[-1]}", repo, []
    return None


def _chunks(h: BaseHandler) -> Iterator[bytes]:
    """The request body as it arrives (Content-Length or chunked transfer encoding)."""
    if "chunked" in (h.headers.get("Transfer-Encoding") or "").lower():
        while True:
            size = int(h.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while h.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return
            yield h.rfile.read(size)
            h.rfile.readline()
    left = int(h.headers.get("Content-Length") or 0)
    while left > 0:
        chunk = h.rfile.read(min(left, 1 << 20))
        if not chunk:
            return
        left -= len(chunk)
        yield chunk


def _drain(h: BaseHandler) -> None:
    for _ in _chunks(h):
        pass


def _json_body(h: BaseHandler) -> Any:
    data = b"".join(_chunks(h))
    try:
        return json.loads(data) if data else {}
    except ValueError:
        return None


def _lines(h: BaseHandler) -> list[Any] | None:
    try:
        return [json.loads(line) for line in b"".join(_chunks(h)).splitlines() if line.strip()]
    except ValueError:
        return None


def _base(h: BaseHandler, cdn: bool = False) -> str:
    host = (h.headers.get("Host") or "").rsplit(":", 1)[0] or h.hub.host
    if cdn and host == h.hub.host:
        host = h.hub.cdn_host
    return f"http://{host}:{h.hub.port}"


def _prefix(rtype: str) -> str:
    return "datasets/" if rtype == "dataset" else ""


def _create(h: BaseHandler, _repo: Any, _rest: list[str], body: Any) -> None:
    if not isinstance(body, dict) or not body.get("name"):
        return h._error(400, None, "name is required")
    rtype = body.get("type") or "model"
    repo_id = "/".join(x for x in (body.get("organization"), body["name"]) if x)
    h._rec.repo_id = repo_id
    url = f"{_base(h)}/{_prefix(rtype)}{repo_id}"
    if not h.hub._create_repo(repo_id, rtype, body.get("visibility") == "private" or bool(body.get("private"))):
        return h._json(409, {"error": "You already created this model repo", "url": url})
    h._json(200, {"url": url, "name": repo_id, "id": uuid.uuid5(uuid.NAMESPACE_URL, url).hex[:24]})


def _validate_yaml(h: BaseHandler, _repo: Any, _rest: list[str], body: Any) -> None:
    import yaml

    text = body.get("content", "") if isinstance(body, dict) else ""
    errors = []
    if text.startswith("---\n"):
        try:
            meta = yaml.safe_load(text[4:].split("\n---\n", 1)[0])
            if not isinstance(meta, dict):
                errors.append("metadata is not a YAML mapping")
        except yaml.YAMLError as e:
            errors.append(f"invalid YAML: {str(e).splitlines()[0]}")
    h._json(400 if errors else 200, {"errors": [{"message": m} for m in errors], "warnings": []})


def _preupload(h: BaseHandler, repo: Any, rest: list[str], body: Any) -> None:
    import base64

    rev = rest[0]
    if rev not in repo.branches and rev not in repo.commits:
        return h._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
    if not isinstance(body, dict) or not isinstance(body.get("files"), list):
        return h._error(400, None, "files is required")
    out = []
    for f in body["files"]:
        sample = base64.b64decode(f.get("sample", ""))
        out.append(
            {
                "path": f["path"],
                "uploadMode": storemod.upload_mode(f["path"], int(f.get("size", 0)), sample),
                "shouldIgnore": False,
                "oid": storemod.existing_oid(repo, rev, f["path"]),
            }
        )
    h._json(200, {"files": out, "commitOid": repo.branches.get(rev, rev)})


def _branch(h: BaseHandler, repo: Any, rest: list[str], body: Any) -> None:
    with h.hub._lock:
        if rest[0] in repo.branches:
            return h._error(409, None, "Reference already exists")
        start = (body or {}).get("startingPoint") or "main"
        sha = repo.branches.get(start, start)
        if sha not in repo.commits:
            return h._error(404, "RevisionNotFound", f"Invalid rev id: {start}")
        repo.branches[rest[0]] = sha
    h._json(200, {})


def _lfs_batch(h: BaseHandler, repo: Any, _rest: list[str], body: Any) -> None:
    if not isinstance(body, dict) or body.get("operation") != "upload":
        return h._error(400, None, "only the upload operation is supported")
    objects = []
    for o in body.get("objects") or []:
        oid, size = str(o.get("oid")), int(o.get("size", 0))
        entry: dict[str, Any] = {"oid": oid, "size": size, "authenticated": True}
        have = repo.lfs.get(oid)
        if have is None or have.stat().st_size != size:
            entry["actions"] = {
                "upload": {"href": f"{_base(h, cdn=True)}/lfs-upload/{repo.repo_type}/{repo.repo_id}/{oid}"},
                "verify": {"href": f"{_base(h)}/{_prefix(repo.repo_type)}{repo.repo_id}.git/info/lfs/objects/verify"},
            }
        objects.append(entry)
    h._json(200, {"transfer": "basic", "objects": objects})


def _put(h: BaseHandler, repo: Any, oid: str, cut: Any) -> None:
    """Receive an object's bytes; keep them only when their sha256 is the oid (a cut body is dropped)."""
    h._rec.file = oid
    total = int(h.headers.get("Content-Length") or -1)
    stop = (cut.at if cut.at is not None else max(0, total) // 2) if cut is not None else None
    tmp = h.hub.store / f".{uuid.uuid4().hex}.part"
    digest, got = hashlib.sha256(), 0
    try:
        with open(tmp, "wb") as out:
            for chunk in _chunks(h):
                if stop is not None and got + len(chunk) >= stop:
                    h._rec.sent = stop  # bytes read before the connection drops (`sent`: what moved)
                    h.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    raise _Stop()
                out.write(chunk)
                digest.update(chunk)
                got += len(chunk)
        h._rec.sent = got
        if digest.hexdigest() != oid:
            return h._error(400, None, f"sha256 of the {got} bytes received is not {oid}")
        with h.hub._lock:
            final = h.hub.store / oid
            os.replace(tmp, final)
            repo.lfs[oid] = final
    finally:
        if tmp.exists():
            tmp.unlink()
    h._json(200, {})


def _lfs_verify(h: BaseHandler, repo: Any, _rest: list[str], body: Any) -> None:
    oid, size = str((body or {}).get("oid")), (body or {}).get("size")
    have = repo.lfs.get(oid)
    if have is None or (size is not None and have.stat().st_size != size):
        return h._error(404, None, f"object {oid} was not uploaded")
    h._json(200, {})


def _commit(h: BaseHandler, repo: Any, rest: list[str], lines: Any) -> None:
    if lines is None:
        return h._error(400, None, "the commit body is not ndjson")
    if "create_pr" in (urlsplit(h.path).query or ""):
        return h._error(400, None, "pull requests are not supported by the loopback hub")
    try:
        with h.hub._lock:
            commit = storemod.apply_commit(repo, rest[0], lines, h.hub.store)
    except storemod.CommitRefused as e:
        return h._error(e.status, e.code, e.message)
    url = f"{_base(h)}/{_prefix(repo.repo_type)}{repo.repo_id}/commit/{commit.sha}"
    h._json(200, {"success": True, "commitOid": commit.sha, "commitUrl": url, "pullRequestUrl": None})


ROUTES = {"create": _create, "validate-yaml": _validate_yaml, "preupload": _preupload, "branch": _branch,
          "lfs-batch": _lfs_batch, "lfs-verify": _lfs_verify, "commit": _commit}  # fmt: skip
