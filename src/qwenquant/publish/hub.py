"""The Hub side of `qwenquant publish`, through huggingface_hub's own upload API (token as the client
reads it: HF_TOKEN or `hf auth login`). The commit is the atomic step: uploads before it change no
revision, and a re-run sends only the LFS objects the Hub does not hold yet."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from qwenquant.errors import QwenquantError
from qwenquant.publish.plan import LocalFile, PublishPlan, RemoteFile

log = logging.getLogger(__name__)


class PublishError(QwenquantError):
    """The Hub refused or failed a publish step; no revision changed (the commit is the last step)."""

    exit_code = 3  # README "Exit codes": the Hub repo could not be used


class PublishInterrupted(QwenquantError):
    """Ctrl-C during the Hub steps: the message says what was committed (README "Exit codes": 130)."""

    exit_code = 130
    # The Hub client's upload threads keep retrying for seconds after Ctrl-C and the interpreter would
    # wait for them at exit: cli.main leaves at once (nothing of ours is left to write).
    exit_now = True


RERUN = (
    "re-run the same command: nothing was committed, objects already uploaded are not sent again, "
    "and the commit is made once everything is there"
)


def hub_error(e: BaseException, step: str, repo_id: str) -> PublishError:
    """One line for a failed step (HTTP status and the server's message), with the next step."""
    import re

    import httpx

    status = getattr(getattr(e, "response", None), "status_code", None)
    cause: BaseException = e
    while isinstance(cause, RuntimeError) and cause.__cause__ is not None:  # the client wraps LFS failures
        m = re.match(r"Error while uploading '(.+)' to the Hub", str(cause))
        step = f"uploading {m.group(1)}" if m else step
        cause = cause.__cause__
    status = status or getattr(getattr(cause, "response", None), "status_code", None)
    text = str(cause).splitlines()[0] if str(cause) else type(cause).__name__
    if isinstance(cause, httpx.TransportError):
        text = f"{type(cause).__name__}: {text}"
    if status in (401, 403):
        return PublishError(
            f"{repo_id}: {step}: the Hub refused the token (HTTP {status})",
            hint="set HF_TOKEN to a token with write access to the repo, or run `hf auth login`",
        )
    if status == 412:
        return PublishError(f"{repo_id}: {step}: the revision moved while publishing (HTTP 412)", hint=RERUN)
    return PublishError(f"{repo_id}: {step} failed{f' (HTTP {status})' if status else ''}: {text}"[:400], hint=RERUN)


def _errors() -> tuple[type[BaseException], ...]:
    import httpx
    from huggingface_hub.errors import HfHubHTTPError

    return (HfHubHTTPError, httpx.TransportError, RuntimeError, OSError, ValueError)


def remote_state(api: Any, repo_id: str, revision: str) -> tuple[str | None, dict[str, RemoteFile]]:
    """(head commit, listing) of `revision`; (None, {}) when the repo or the branch does not exist."""
    from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError
    from huggingface_hub.hf_api import RepoFile

    try:
        head = api.repo_info(repo_id, revision=revision).sha
        entries = list(api.list_repo_tree(repo_id, revision=head, recursive=True))
    except (RepositoryNotFoundError, RevisionNotFoundError):
        return None, {}
    except _errors() as e:
        raise hub_error(e, "reading the revision", repo_id) from None
    return head, {
        e.path: RemoteFile(e.path, e.size, e.blob_id, e.lfs.sha256 if e.lfs else None)
        for e in entries
        if isinstance(e, RepoFile)
    }


def ensure_revision(api: Any, repo_id: str, revision: str, private: bool) -> None:
    """Create the repo (and the branch) when missing; nothing when they exist."""
    try:
        api.create_repo(repo_id, private=private, exist_ok=True)
        if revision != "main":
            api.create_branch(repo_id, branch=revision, exist_ok=True)
    except _errors() as e:
        raise hub_error(e, "creating the repo", repo_id) from None


def download_file(api: Any, repo_id: str, commit: str, path: str) -> bytes:
    """One file of a commit (the signature already on the Hub)."""
    import tempfile
    from pathlib import Path

    from huggingface_hub import hf_hub_download

    with tempfile.TemporaryDirectory() as tmp:
        try:
            got = hf_hub_download(repo_id, path, revision=commit, local_dir=tmp, endpoint=api.endpoint, token=api.token)
        except _errors() as e:
            raise hub_error(e, f"reading {path}", repo_id) from None
        return Path(got).read_bytes()


def _operations(plan: PublishPlan) -> tuple[list[Any], list[Any]]:
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete

    adds = []
    for f in plan.upload:
        op = CommitOperationAdd(path_in_repo=f.path, path_or_fileobj=f.data if f.data is not None else str(f.source))
        op.upload_info.sha256 = bytes.fromhex(f.sha256)  # verified against the manifest moments ago: no re-hash
        adds.append(op)
    return adds, [CommitOperationDelete(path_in_repo=p) for p in plan.delete]


def _interruptible(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`fn` in a daemon thread, so that Ctrl-C reaches this one at once: the client's own thread pool
    would first let every upload finish its retries."""
    import threading

    value: list[Any] = []  # what fn returned, once it did
    error: list[BaseException] = []  # what it raised, handed to the caller as it is

    def run() -> None:
        try:
            value.append(fn(*args, **kwargs))
        except BaseException as e:
            error.append(e)

    t = threading.Thread(target=run, name="qwenquant-publish", daemon=True)
    t.start()
    while t.is_alive():
        t.join(0.2)
    if error:
        raise error[0]
    return value[0]


@dataclass
class Progress:
    """How far the Hub steps of a publish got (what Ctrl-C says): the revision's head, the step, the new commit."""

    head: str | None = None
    step: str = "reading the revision"  # | uploading | committing | checking
    commit: str | None = None


def commit_plan(
    api: Any,
    repo_id: str,
    revision: str,
    plan: PublishPlan,
    parent: str | None,
    message: str,
    where: Progress | None = None,
) -> Any:
    """Upload what the plan sends (LFS objects first), then make the one commit; its CommitInfo.
    `where.step` becomes "committing" once the uploads are done."""
    adds, deletes = _operations(plan)
    try:
        _interruptible(api.preupload_lfs_files, repo_id, additions=adds, revision=revision, free_memory=False)
    except _errors() as e:
        raise hub_error(e, "uploading the files", repo_id) from None
    if where is not None:
        where.step = "committing"
    try:
        return _interruptible(
            api.create_commit,
            repo_id,
            operations=[*adds, *deletes],
            commit_message=message,
            revision=revision,
            parent_commit=parent,
        )
    except _errors() as e:
        raise hub_error(e, "the commit", repo_id) from None


def check_published(
    api: Any, repo_id: str, commit: str, local: list[LocalFile], extra: set[str], git_blob: Callable[[LocalFile], str]
) -> None:
    """The new commit's listing holds each local file with its content (sha256 of an LFS file, git blob id of
    a regular one), and nothing else but `extra`."""
    from qwenquant.publish.plan import same_content

    _, remote = remote_state(api, repo_id, commit)
    bad = [f.path for f in local if f.path not in remote or not same_content(f, remote[f.path], git_blob)]
    bad += sorted(p for p in remote if p not in {f.path for f in local} | extra)
    if bad:
        raise PublishError(
            f"the Hub's listing of {repo_id}@{commit} does not match what was published: {', '.join(bad[:3])}",
            hint="inspect the repo; re-run `qwenquant publish` to repair it",
        )
