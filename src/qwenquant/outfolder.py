"""Folders a command writes: refuse one that holds what qwenquant did not put there.

`quantize --out/--work`, `fetch --out`, `graft-mtp` and `demo --work` replace or write into a
folder. Each asks here first which entries of an existing folder are not its own; any such entry
stops the command (exit 5, nothing touched) unless `--force`. A file where a folder is asked is a usage
error (exit 2), never removed, `--force` or not.

`--force` removes nothing when it is given: `guard` returns a `Removal` that the command applies once
every other check has passed (fetch: the repo resolved and its listing checked; quantize: --out is
replaced only by the verified new artifact, --work's foreign entries go once the source stage passed;
graft-mtp: the rebuilt artifact replaces the folder; demo: at the end), saying on stderr what it removes.
A refused command changes nothing.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from qwenquant.errors import OutFolderError, UsageError

log = logging.getLogger(__name__)

MANIFEST_NAME = "qwenquant-manifest.json"
FETCH_RECORD = "qwenquant-fetch.json"
FETCH_STAGING = ".qwenquant-staging"
DEMO_ENTRIES = {"hub", "models", "artifacts"}
# What a quantize work folder holds: stage folders and records, the lock, the dataset cache, serve logs,
# the streamed gptq engine's per-layer records (gptq-layers, kept for resume), and the staging /
# moved-aside folders and temp files of a killed run.
_WORK_NAME = re.compile(r"^(?:[a-z_]+\.record\.json|[a-z_]+|gptq-layers|\.lock|\..+\.(?:partial|tmp)|\..+\.old-\d+)$")


def _entries(folder: Path) -> list[Path]:
    return sorted(folder.iterdir()) if folder.is_dir() else []


def summarize(paths: Iterable[Path], root: Path) -> str:
    """'3 files, 12 bytes: notes.txt, a/b.bin, ...' for what would be removed."""
    files, size, names = 0, 0, []
    for p in paths:
        names.append(p.relative_to(root).as_posix() if p != root else p.name)
        for f in [p] if not p.is_dir() or p.is_symlink() else [q for q in p.rglob("*") if not q.is_dir()]:
            files += 1
            size += f.lstat().st_size
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    return f"{files} file(s), {size:,} bytes: {shown}"


class Removal:
    """What --force removes from `folder`, applied only when the command calls `apply()`."""

    def __init__(self, folder: Path, targets: list[Path], said: str, flag: str) -> None:
        self.folder, self.targets, self.said, self.flag = folder, targets, said, flag

    def apply(self) -> None:
        """Say on stderr what goes, and remove it (what is gone already is skipped)."""
        left = [p for p in self.targets if p.exists() or p.is_symlink()]
        if not left:
            return
        log.warning("--force: removing %s", self.said)
        for p in left:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()


def refuse_a_file(folder: Path, flag: str) -> None:
    """UsageError (exit 2) when `folder` is a file or a link to one: it is never removed, --force or not."""
    folder = Path(folder)
    if (folder.exists() or folder.is_symlink()) and not folder.is_dir():
        raise UsageError(
            f"{flag} {folder} is a file, not a folder",
            hint=f"nothing was touched: pass a folder as {flag} (a new one, or one qwenquant wrote)",
        )


def guard(
    folder: Path, foreign: list[Path], *, force: bool, flag: str, problem: str, remove: list[Path] | None = None
) -> Removal | None:
    """Raise OutFolderError naming the `foreign` entries of `folder`; with `force`, return the Removal
    the command applies once every other check passed (None: nothing to remove). `remove` is what
    --force deletes (default: the whole folder, rebuilt after). A file for `folder`: UsageError."""
    refuse_a_file(folder, flag)
    if not foreign:
        return None
    folder = Path(folder)
    if not force:
        raise OutFolderError(
            f"{flag} {folder} {problem}; it holds {summarize(foreign, folder)}",
            hint="nothing was touched: "
            + (f"choose another {flag}" if remove is None else "move them away")
            + ", or pass --force to remove "
            + ("it" if remove is None else "them"),
        )
    if remove is None:
        return Removal(folder, [folder], f"{folder}, which holds {summarize(foreign, folder)}", flag)
    return Removal(folder, remove, summarize(remove, folder), flag)


def _not_a_folder(folder: Path) -> list[Path]:
    return [folder] if (folder.exists() or folder.is_symlink()) and not folder.is_dir() else []


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def local_file_sizes(source: Path) -> dict[str, int]:
    """path -> size of every visible file of a model folder, the fetch record left out."""
    out = {}
    for p in sorted(Path(source).rglob("*")):
        rel = p.relative_to(source)
        if p.is_file() and not any(s.startswith(".") for s in rel.parts) and rel.as_posix() != FETCH_RECORD:
            out[rel.as_posix()] = p.stat().st_size
    return out


def foreign_in_artifact_out(out: Path, recipe_name: str, source: Path) -> list[Path]:
    """Entries of an existing `quantize --out` that a rebuild would lose and that are not this build's.

    The folder is this build's when its manifest names the same recipe and the same source files
    (path and size), and it holds nothing the manifest does not list.
    """
    if bad := _not_a_folder(out):
        return bad
    entries = _entries(out)
    if not entries:
        return []
    manifest = _read_json(out / MANIFEST_NAME)
    if not isinstance(manifest, dict):
        return entries
    listed = {f.get("path") for f in manifest.get("files") or [] if isinstance(f, dict)} | {MANIFEST_NAME}
    extra = [p for p in entries if p.name not in {s.split("/")[0] for s in listed if isinstance(s, str)}]
    recipe = (manifest.get("recipe") or {}).get("name") if isinstance(manifest.get("recipe"), dict) else None
    files = (manifest.get("source") or {}).get("files") if isinstance(manifest.get("source"), dict) else None
    same_source = isinstance(files, dict) and {
        k: v.get("size") for k, v in files.items() if isinstance(v, dict)
    } == local_file_sizes(source)
    if recipe != recipe_name or not same_source:
        return entries
    return extra


def foreign_in_work(work: Path) -> list[Path]:
    """Entries of a quantize work folder that no stage wrote."""
    return _not_a_folder(work) or [p for p in _entries(work) if not _WORK_NAME.match(p.name)]


def foreign_in_fetch_out(out: Path, repo_id: str, repo_type: str) -> list[Path]:
    """Entries of an existing `fetch --out` unless it holds a fetch (finished or partial) of this repo."""
    if bad := _not_a_folder(out):
        return bad
    entries = _entries(out)
    if not entries:
        return []
    rec = _read_json(out / FETCH_RECORD)
    if isinstance(rec, dict) and rec.get("repo_id") == repo_id and rec.get("repo_type", "model") == repo_type:
        return []
    pending = _read_json(out / FETCH_STAGING / "pending.json")
    if (out / FETCH_STAGING).is_dir() and (
        pending is None
        or (isinstance(pending, dict) and (pending.get("repo_id"), pending.get("repo_type")) == (repo_id, repo_type))
    ):
        return []  # an interrupted fetch of this repo (or one killed before it wrote what it fetches)
    return entries


def foreign_in_demo_work(work: Path) -> list[Path]:
    """Entries of `demo --work` other than the hub, models and artifacts folders the demo writes."""
    return _not_a_folder(work) or [p for p in _entries(work) if p.name not in DEMO_ENTRIES]


def foreign_in_graft_target(artifact: Path, keep: set[str]) -> list[Path]:
    """Entries of an artifact that graft-mtp would not carry over (`keep`: the names it carries)."""
    return [p for p in _entries(artifact) if p.name not in keep]
