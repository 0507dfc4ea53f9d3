"""`fetch_snapshot`: pin a revision to one commit, download every file, verify, write the record last.

Everything is staged first: downloads land in `.qwenquant-staging/tree/` (files already verified in
the folder are hard-linked there), and the listing, the configs and index, the manifest and the card
(`verify_artifact`) are checked on that tree. Only then do files move into place, stale ones go, and
the fetch record is written, last. A refused fetch leaves the folder as it was."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qwenquant import envs
from qwenquant.atomic import atomic_write_json, exclusive_lock, fsync_dir
from qwenquant.checkpoint.header import INDEX_NAME, SafetensorsError, check_index, load_index_json, read_header
from qwenquant.errors import FetchError, QwenquantError, UsageError, VerificationError
from qwenquant.fetch.pinning import PENDING_NAME, pin_commit
from qwenquant.fetch.record import write_record
from qwenquant.fetch.selection import STAGING_NAME, RemoteFile, check_listing, config_problems
from qwenquant.fetch.staged import (
    TREE_NAME,
    move_into_place,
    prune_tree,
    refuse_unnamed_companions,
    reuse_verified,
    tidy,
)
from qwenquant.fetch.transfer import Cancelled, FileDigest, Session, download_file

log = logging.getLogger(__name__)


@dataclass
class FetchResult:
    repo_id: str
    commit: str
    out_dir: Path
    record: dict[str, Any]
    downloaded_files: list[str] = field(default_factory=list)
    reused_files: list[str] = field(default_factory=list)
    downloaded_bytes: int = 0
    note: str | None = None  # why this commit, when it is not the one recorded (content pinning)
    artifact: Any = None  # manifest.VerifyReport of a published qwenquant artifact (qwenquant-manifest.json)


@dataclass
class Progress:
    """Callbacks the CLI hooks a progress bar to (all optional)."""

    start: Callable[[int, int], None] | None = None  # (total bytes, total files)
    advance: Callable[[int], None] | None = None  # bytes (negative when a file restarts)
    file_done: Callable[[str], None] | None = None


def fetch_snapshot(
    repo_id: str,
    out_dir: Path,
    *,
    revision: str = "main",
    repo_type: str = "model",
    endpoint: str | None = None,
    token: str | bool | None = None,
    re_resolve: bool = False,
    workers: int = 8,
    attempts: int = 5,
    backoff: float | None = None,
    check_model: bool | None = None,
    progress: Progress | None = None,
    only: tuple[str, ...] = (),
    expect: dict[str, Any] | None = None,
    verify_artifact: Callable[[Path], Any] | None = None,
    root: str | None = None,
    before_move: Callable[[], None] | None = None,
) -> FetchResult:
    """Fetch `repo_id` at one pinned commit into `out_dir`, verifying every file; return the record.

    `only`: fetch just these paths of the repo (each must exist at the commit). `expect`: a fetch
    record whose content the commit must hold (fetch/pinning.py). A published qwenquant artifact
    (qwenquant-manifest.json) is verified against its manifest too, by `verify_artifact(folder)` (default:
    manifest.verify_artifact; the command passes one that re-derives the card as well); `root`: the
    manifest's root digest the artifact must have. `before_move`: called once everything is downloaded
    and verified, just before the files move into `out_dir` (fetch --force removes a folder's foreign
    entries there, so a refused fetch removes nothing)."""
    from huggingface_hub import constants

    out_dir = Path(out_dir)
    endpoint = (endpoint or os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")
    check_model = (repo_type == "model") if check_model is None else check_model
    backoff = envs.get("QWENQUANT_FETCH_BACKOFF") if backoff is None else backoff
    progress = progress or Progress()
    staging = out_dir / STAGING_NAME
    fresh = (not out_dir.exists(), not staging.exists())  # what to tidy away again when the fetch is refused
    try:
        staging.mkdir(parents=True, exist_ok=True)
        with _exclusive(staging):
            return _fetch(repo_id, out_dir, staging, revision=revision, repo_type=repo_type, endpoint=endpoint,
                          token=token, re_resolve=re_resolve, workers=workers, attempts=attempts, backoff=backoff,
                          check_model=check_model, progress=progress, only=only, expect=expect,
                          verify_artifact=verify_artifact, root=root, before_move=before_move)  # fmt: skip
    except OSError as e:  # disk full, permissions, --out is a file: name the path, no traceback
        where = e.filename or out_dir
        raise FetchError(f"{where}: {e.strerror or e}", hint="check --out (free space, permissions)") from e
    except QwenquantError:
        tidy(out_dir, staging, *fresh)
        raise


def _exclusive(staging: Path) -> contextlib.AbstractContextManager[None]:
    """One fetch per out folder at a time (two would steal each other's partials)."""
    busy = UsageError(
        f"another qwenquant fetch is writing into {staging.parent}", hint="wait for it to finish, or use another --out"
    )
    return exclusive_lock(staging / "lock", busy)


def _check_free_space(out_dir: Path, todo: list[RemoteFile]) -> int:
    """The bytes still to download; a FetchError when the disk of `out_dir` has less free."""
    need = sum(f.size for f in todo)
    free = shutil.disk_usage(out_dir).free
    if need > free:
        raise FetchError(
            f"{out_dir}: {need / 2**30:.2f} GiB still to download but only {free / 2**30:.2f} GiB free",
            hint="free some space or choose another --out",
        )
    return need


def _validate_tree(tree: Path, files: list[RemoteFile], check_model: bool) -> None:
    """Every small JSON file of the tree (those already in place too), and the shards with `check_model`."""
    for f in files:
        if f.path.endswith(".json") and not f.lfs:
            validate_file(tree / f.path, f.path, check_model)
    if check_model:
        check_shards(tree, {f.path for f in files})


def _fetch(repo_id: str, out_dir: Path, staging: Path, *, revision: str, repo_type: str, endpoint: str,
           token: str | bool | None, re_resolve: bool, workers: int, attempts: int, backoff: float,
           check_model: bool, progress: Progress, only: tuple[str, ...] = (),
           expect: dict[str, Any] | None = None, verify_artifact: Callable[[Path], Any] | None = None,
           root: str | None = None, before_move: Callable[[], None] | None = None) -> FetchResult:  # fmt: skip
    from huggingface_hub import HfApi
    from huggingface_hub.utils import build_hf_headers, get_session

    api = _Retrying(HfApi(endpoint=endpoint, token=token), attempts, backoff)
    pinned = pin_commit(api, out_dir, repo_id, repo_type, revision, endpoint, re_resolve, expect)
    commit = pinned.commit
    if pinned.note:
        log.warning("%s", pinned.note)
    log.info("%s %s -> commit %s", repo_id, revision, commit)
    files = _select(pinned.files, only, repo_id, commit)
    pending = {"repo_id": repo_id, "repo_type": repo_type, "revision": revision, "commit": commit,
               "endpoint": endpoint}  # fmt: skip
    names = _stage_listing(staging, files, pending, root, check_model)

    tree = staging / TREE_NAME
    digests, todo = reuse_verified(out_dir, tree, files, workers)
    need = _check_free_space(out_dir, todo)
    log.info("%d files verified already, %d to download (%.1f MiB)", len(digests), len(todo), need / 2**20)
    if progress.start:
        progress.start(need, len(todo))

    session = Session(get_session(), build_hf_headers(token=token), endpoint, repo_id, repo_type, commit,
                      attempts=attempts, backoff=backoff, cancel=threading.Event(), on_bytes=progress.advance)  # fmt: skip
    for d in _download_todo(session, todo, tree, staging, workers, check_model, progress):
        digests[d.path] = d

    with _refusal_drops_staging(staging):
        _validate_tree(tree, files, check_model)
        artifact = verify_published(tree, repo_id, commit, names, verify_artifact, root)
    if before_move is not None:
        before_move()
    move_into_place(out_dir, tree, commit, files)
    content_pin = {"replaces_commit": pinned.replaces, "note": pinned.note} if pinned.note else None
    record = write_record(out_dir, repo_id, repo_type, revision, commit, endpoint, files, digests, content_pin)
    shutil.rmtree(staging, ignore_errors=True)
    downloaded = [f.path for f in todo]
    if artifact is not None:
        artifact = dataclasses.replace(artifact, artifact_dir=str(out_dir))
    return FetchResult(repo_id, commit, out_dir, record, downloaded,
                       sorted(set(digests) - set(downloaded)), sum(d.downloaded for d in digests.values()),
                       pinned.note, artifact)  # fmt: skip


def _stage_listing(
    staging: Path, files: list[RemoteFile], pending: dict[str, Any], root: str | None, check_model: bool
) -> set[str]:
    """The names of the commit's files to fetch, checked (the listing, the companions a published artifact names,
    a model's config.json), with the pending record (`pending`: the repo, revision, commit and endpoint) written
    to `staging`: re-runs after an interruption reuse this commit (unless --re-resolve) and know what it put
    there. The staged tree keeps only these names."""
    repo_id, commit = pending["repo_id"], pending["commit"]
    check_listing(files)
    names = {f.path for f in files}
    refuse_unnamed_companions(names, repo_id, commit, root)
    prune_tree(staging / TREE_NAME, names)
    atomic_write_json(staging / PENDING_NAME, {**pending, "files": sorted(names)})
    if check_model and "config.json" not in names:
        raise FetchError(f"{repo_id}@{commit} has no config.json", hint="is this a model repo? (--repo-type dataset)")
    return names


@contextlib.contextmanager
def _refusal_drops_staging(staging: Path) -> Iterator[None]:
    """A refusal inside drops the staged tree and the pending record: the folder keeps what it held, and there
    is nothing to resume."""
    try:
        yield
    except QwenquantError:
        shutil.rmtree(staging / TREE_NAME, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            (staging / PENDING_NAME).unlink()
        raise


def verify_published(
    folder: Path,
    repo_id: str,
    commit: str,
    names: set[str],
    verify_artifact: Callable[[Path], Any] | None = None,
    root: str | None = None,
) -> Any:
    """A fetched qwenquant artifact against its own manifest (None when the repo holds none); `root`:
    the root digest it must have."""
    from qwenquant.manifest import MANIFEST_NAME
    from qwenquant.manifest import verify_artifact as manifest_only

    if MANIFEST_NAME not in names:
        return None
    report = (verify_artifact or manifest_only)(folder)
    if not report.ok:
        raise VerificationError(
            f"{repo_id}@{commit} matches the Hub's hashes but not its own {MANIFEST_NAME}: "
            + ", ".join(
                f"{p.path} ({p.status}{': ' + p.detail if p.status == 'card' else ''})" for p in report.problems[:5]
            ),
            hint="the published files and manifest disagree (or the card was edited); never serve it; "
            "nothing in the folder was changed",
        )
    if root is not None and report.root_digest != root:
        raise VerificationError(
            f"{repo_id}@{commit} holds an artifact of root digest sha256:{report.root_digest}, "
            f"not the pinned sha256:{root}",
            hint="the repo holds another artifact than the one announced; nothing in the folder "
            "was changed; ask the publisher which revision holds it",
        )
    log.info("published artifact verified: root digest %s", report.root_digest)
    return report


class _Retrying:
    """HfApi calls retried on 429/5xx and connection errors (model_info and the first tree page are not)."""

    def __init__(self, api: Any, attempts: int, backoff: float) -> None:
        self.api, self.attempts, self.backoff = api, attempts, backoff

    def __getattr__(self, name: str) -> Callable[..., Any]:
        import httpx
        from huggingface_hub.errors import HfHubHTTPError

        fn = getattr(self.api, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            for attempt in range(1, self.attempts + 1):
                try:
                    out = fn(*args, **kwargs)
                    return list(out) if name == "list_repo_tree" else out
                except (HfHubHTTPError, httpx.TransportError) as e:
                    status = getattr(getattr(e, "response", None), "status_code", None)
                    transient = isinstance(e, httpx.TransportError) or status in (429, 500, 502, 503, 504)
                    if not transient or attempt == self.attempts:
                        raise
                    log.warning("%s: %s; retry %d/%d", name, str(e).splitlines()[0], attempt, self.attempts - 1)
                    time.sleep(min(self.backoff * 2 ** (attempt - 1), 8.0))
            raise AssertionError("unreachable")

        return call


def _select(files: list[RemoteFile], only: tuple[str, ...], repo_id: str, commit: str) -> list[RemoteFile]:
    """The listed files named in `only` (all of them when it is empty); a missing name is an error."""
    if not only:
        return files
    missing = sorted(set(only) - {f.path for f in files})
    if missing:
        raise FetchError(f"{repo_id}@{commit} has no file {missing[0]}", hint="check the file path and the revision")
    return [f for f in files if f.path in only]


def _download_todo(session: Session, todo: list[RemoteFile], tree: Path, staging: Path, workers: int,
                   check_model: bool, progress: Progress) -> list[FileDigest]:  # fmt: skip
    """Every file of `todo` downloaded: configs first, so a refused model stops before the big shards start,
    then the rest, largest first."""
    first = [f for f in todo if f.path.endswith(".json") and not f.lfs]
    rest = sorted((f for f in todo if f not in first), key=lambda f: -f.size)
    return [
        d
        for batch in (first, rest)
        for d in _download_all(session, batch, tree, staging, workers, check_model, progress)
    ]


def _download_all(session: Session, batch: list[RemoteFile], tree: Path, staging: Path, workers: int,
                  check_model: bool, progress: Progress) -> list[FileDigest]:  # fmt: skip
    def one(f: RemoteFile) -> FileDigest:
        tmp, d = download_file(session, f, staging)
        try:
            validate_file(tmp, f.path, check_model)
            final = tree / f.path
            final.parent.mkdir(parents=True, exist_ok=True)
            if not final.resolve().is_relative_to(tree.resolve()):
                raise FetchError(f"{f.path} would land outside {tree}", hint="remove symlinked folders from --out")
            os.replace(tmp, final)
            fsync_dir(final.parent)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            raise
        log.info("verified %s (%d bytes)", f.path, f.size)
        if progress.file_done:
            progress.file_done(f.path)
        return d

    if not batch:
        return []
    cancel = session.cancel
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(batch)))) as pool:
        futures = [pool.submit(one, f) for f in batch]
        try:
            wait(futures, return_when=FIRST_EXCEPTION)
        except BaseException:  # Ctrl-C: stop the workers between chunks; partials stay for the next run
            cancel.set()
            raise
        if any(fu.done() and fu.exception() is not None for fu in futures):
            cancel.set()
            wait(futures)
            errors = [e for fu in futures if (e := fu.exception()) is not None]
            real = [e for e in errors if not isinstance(e, Cancelled)]
            raise (real or errors)[0]
        return [fu.result() for fu in futures]


def validate_file(path: Path, name: str, check_model: bool) -> None:
    """Content checks before a verified file is renamed into place (and for files already there, and
    for a local source folder): safetensors headers against the file size, configs parse, no remote code."""
    base = name.rsplit("/", 1)[-1]
    if base.endswith(".safetensors"):
        try:
            read_header(path)
        except SafetensorsError as e:
            raise FetchError(f"{name}: {e}", hint="the repo's weights are malformed; refusing to use them") from None
    elif base.endswith(".json") and ("config" in base or base == "config.json"):
        try:
            cfg = json.loads(path.read_bytes())
        except ValueError as e:
            raise FetchError(f"{name} is not valid JSON ({e})", hint="the repo is broken") from None
        problems = config_problems(name, cfg, model_config=check_model and name == "config.json")
        if problems:
            raise FetchError("; ".join(problems), hint="qwenquant fetches Qwen3.5-architecture safetensors repos only")


def check_shards(out_dir: Path, names: set[str]) -> None:
    """The index against the shards' headers: every shard it names exists and holds what it says."""
    if INDEX_NAME not in names:
        return
    try:
        index = load_index_json((out_dir / INDEX_NAME).read_bytes())
        weight_map = index.get("weight_map") or {}
        shard_names = {v for v in weight_map.values() if isinstance(v, str)} if isinstance(weight_map, dict) else set()
        shards = {n: read_header(out_dir / n) for n in sorted(shard_names) if n in names and n.endswith(".safetensors")}
    except SafetensorsError as e:
        raise FetchError(f"{INDEX_NAME}: {e}", hint="the repo's index is malformed") from None
    problems = check_index(index, shards, names)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise FetchError(f"{INDEX_NAME}: {problems[0]}{more}", hint="the repo's index and shards disagree; refusing it")
