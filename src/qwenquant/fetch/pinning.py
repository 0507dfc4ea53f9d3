"""Which commit a fetch uses, and content pinning that survives a history rewrite.

A 40-hex revision is the commit. Otherwise a re-run reuses the commit its pending run or fetch record
names (`--re-resolve` looks again). When that commit is gone from the server (a squash, a force-push),
the branch is resolved again and its new commit is accepted only if every file's sha256 (LFS) / git
blob id equals the record's. `--expect RECORD` pins the content strictly: whatever commit is used,
also after `--re-resolve` or a moved branch, must hold exactly the record's files.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qwenquant.errors import FetchError
from qwenquant.fetch.selection import RECORD_NAME, STAGING_NAME, RemoteFile

log = logging.getLogger(__name__)

COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
PENDING_NAME = "pending.json"


@dataclass(frozen=True)
class Pinned:
    """The commit to fetch, its listing, and (when it is not the one asked for or recorded) why."""

    commit: str
    files: list[RemoteFile]
    note: str | None = None
    replaces: str | None = None  # the recorded commit this one stands in for


class CommitGone(FetchError):
    """A reused (recorded) commit is no longer on the server."""


def content_diff(recorded: list[dict[str, Any]], listed: list[RemoteFile]) -> list[str]:
    """How a listing differs from a record's files: by sha256 for LFS files, git blob id otherwise."""
    want, got = {f["path"]: f for f in recorded}, {f.path: f for f in listed}
    out = [f"{p} (missing)" for p in sorted(set(want) - set(got))]
    out += [f"{p} (added)" for p in sorted(set(got) - set(want))]
    for p in sorted(set(want) & set(got)):
        w, g = want[p], got[p]
        if g.size != w.get("size") or ((g.sha256 != w.get("sha256")) if g.lfs else (g.blob_id != w.get("git_blob_id"))):
            out.append(f"{p} (changed)")
    return out


def pin_commit(
    api: Any,
    out_dir: Path,
    repo_id: str,
    repo_type: str,
    revision: str,
    endpoint: str,
    re_resolve: bool,
    expect: dict[str, Any] | None = None,
) -> Pinned:
    """Pick the commit (see the module doc), list it, and apply the record's content pin."""
    recorded = expect or _record(out_dir, repo_id, repo_type, revision)
    commit, reused = _pick_commit(api, out_dir, repo_id, repo_type, revision, endpoint, re_resolve, expect)
    try:
        files = list_commit(api, repo_id, repo_type, commit, asked_for=revision == commit)
    except CommitGone:
        if recorded is None or not reused:
            raise
        new = resolve(api, repo_id, repo_type, revision, endpoint)
        files = list_commit(api, repo_id, repo_type, new)
        _refuse_changed(recorded, files, repo_id, revision, new, f"commit {commit} is no longer on the server")
        note = (
            f"commit {commit} is no longer on the server (history rewritten?); {revision} now points at {new}, "
            f"whose {len(files)} files all equal the record by sha256 / git blob id: using {new}"
        )
        return Pinned(new, files, note, replaces=commit)
    if expect is not None:
        _refuse_changed(expect, files, repo_id, revision, commit, f"{revision} is at {commit}")
        if commit != expect.get("commit"):
            note = (
                f"{revision} moved from the expected commit {expect.get('commit')} to {commit}, whose {len(files)} "
                f"files all equal the record by sha256 / git blob id: using {commit}"
            )
            return Pinned(commit, files, note, replaces=expect.get("commit"))
    return Pinned(commit, files)


def _refuse_changed(
    recorded: dict[str, Any], files: list[RemoteFile], repo_id: str, revision: str, commit: str, why: str
) -> None:
    diff = content_diff(recorded.get("files") or [], files)
    if diff:
        more = f" and {len(diff) - 3} more" if len(diff) > 3 else ""
        raise FetchError(
            f"{why}, and {repo_id}@{commit} does not hold the recorded content: "
            f"{', '.join(diff[:3])}{more}; refusing it",
            hint=f"to take {revision}'s new content deliberately: --re-resolve (without --expect); "
            "it is verified and recorded anew",
        )


def _record(out_dir: Path, repo_id: str, repo_type: str, revision: str) -> dict[str, Any] | None:
    """The fetch record in `out_dir` when it is of this repo and revision (its files pin the content)."""
    with contextlib.suppress(OSError, ValueError):
        rec = json.loads((out_dir / RECORD_NAME).read_text())
        if (
            isinstance(rec, dict)
            and (rec.get("repo_id"), rec.get("repo_type"), rec.get("revision")) == (repo_id, repo_type, revision)
            and isinstance(rec.get("files"), list)
        ):
            return rec
    return None


def _pick_commit(
    api: Any,
    out_dir: Path,
    repo_id: str,
    repo_type: str,
    revision: str,
    endpoint: str,
    re_resolve: bool,
    expect: dict[str, Any] | None,
) -> tuple[str, bool]:
    """(commit, reused): a 40-hex revision is the commit; else reuse the expected, pending or recorded
    commit (unless `re_resolve`); else resolve the revision once."""
    if COMMIT_RE.match(revision):
        return revision, False
    if not re_resolve:
        if expect is not None and COMMIT_RE.match(str(expect.get("commit"))):
            return expect["commit"], True
        for path in (out_dir / STAGING_NAME / PENDING_NAME, out_dir / RECORD_NAME):
            with contextlib.suppress(OSError, ValueError):
                prev = json.loads(path.read_text())
                if (prev.get("repo_id"), prev.get("repo_type"), prev.get("revision")) == (repo_id, repo_type, revision):
                    if COMMIT_RE.match(str(prev.get("commit"))):
                        log.info(
                            "reusing commit %s recorded in %s (pass --re-resolve to look again)", prev["commit"], path
                        )
                        return prev["commit"], True
    return resolve(api, repo_id, repo_type, revision, endpoint), False


def resolve(api: Any, repo_id: str, repo_type: str, revision: str, endpoint: str) -> str:
    """The commit `revision` points at now."""
    import httpx
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

    try:
        info = api.repo_info(repo_id, revision=revision, repo_type=repo_type)
    except RepositoryNotFoundError:
        raise FetchError(f"{repo_type} repo {repo_id} not found at {endpoint}",
                         hint="check the repo id, HF_ENDPOINT, and HF_TOKEN for private repos") from None  # fmt: skip
    except RevisionNotFoundError:
        raise FetchError(
            f"revision {revision!r} not found in {repo_id}", hint="pass a branch, tag or 40-hex commit"
        ) from None
    except (HfHubHTTPError, OSError, httpx.TransportError) as e:
        raise FetchError(f"could not resolve {repo_id}@{revision} at {endpoint}: {e}".splitlines()[0],
                         hint="check the network and HF_ENDPOINT, then re-run") from None  # fmt: skip
    if not (info.sha and COMMIT_RE.match(info.sha)):
        raise FetchError(f"server gave no commit for {repo_id}@{revision}", hint="check HF_ENDPOINT")
    return info.sha


def list_commit(api: Any, repo_id: str, repo_type: str, commit: str, *, asked_for: bool = False) -> list[RemoteFile]:
    """The files at `commit` (`asked_for`: the user passed this commit, rather than it being reused)."""
    import httpx
    from huggingface_hub.errors import HfHubHTTPError, RevisionNotFoundError
    from huggingface_hub.hf_api import RepoFile

    try:
        entries = list(api.list_repo_tree(repo_id, revision=commit, recursive=True, repo_type=repo_type))
    except RevisionNotFoundError:
        if asked_for:
            raise FetchError(
                f"commit {commit} was not found on the server in {repo_id}",
                hint="check the commit id, or pass a branch or tag (e.g. --revision main)",
            ) from None
        raise CommitGone(f"commit {commit} of {repo_id} is no longer on the server",
                         hint="pass --re-resolve to pin the branch's current commit") from None  # fmt: skip
    except (HfHubHTTPError, OSError, httpx.TransportError) as e:
        raise FetchError(f"could not list {repo_id}@{commit}: {e}".splitlines()[0],
                         hint="check the network and HF_ENDPOINT, then re-run") from None  # fmt: skip
    files = [RemoteFile(e.path, e.size, e.blob_id, e.lfs.sha256 if e.lfs else None)
             for e in entries if isinstance(e, RepoFile)]  # fmt: skip
    if not files:
        raise FetchError(f"{repo_id}@{commit} lists no files", hint="check the repo id and revision")
    return files
