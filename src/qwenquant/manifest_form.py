"""The form of `qwenquant-manifest.json`: the `Manifest` record (`to_dict()` is its JSON) and the JSON read back
into one (`manifest_from_dict`), refused with every structural problem: the keys, their types, the file list's
clean, sorted, relative paths, sizes and hex digests. Digests themselves are checked by verify (manifest.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from qwenquant.errors import VerificationError
from qwenquant.hashing import self_digest

MANIFEST_NAME = "qwenquant-manifest.json"
SCHEMA_VERSION = 2  # 2: the root digest covers the recipe too
_DICT_FIELDS = ("source", "recipe", "calibration", "stages", "quality", "tool_versions", "extra")
HEX64 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class FileDigest:
    """One file of the artifact: relative POSIX path, size in bytes, hex sha256."""

    path: str
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    """What an artifact holds and how it was made; `to_dict()` is the JSON written to disk."""

    files: tuple[FileDigest, ...]
    root_digest: str
    source: dict[str, Any]
    recipe: dict[str, Any]
    recipe_sha256: str
    calibration: dict[str, Any]
    stages: dict[str, Any]
    quality: dict[str, Any]
    tool_versions: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    def body(self) -> dict[str, Any]:
        """Everything except the self digest (what the self digest covers)."""
        return {
            "schema_version": self.schema_version,
            "root_digest": self.root_digest,
            "files": [{"path": f.path, "size": f.size, "sha256": f.sha256} for f in self.files],
            **{k: getattr(self, k) for k in _DICT_FIELDS},
            "recipe_sha256": self.recipe_sha256,
        }

    @property
    def self_digest(self) -> str:
        return manifest_self_digest(self.body())

    def to_dict(self) -> dict[str, Any]:
        return {**self.body(), "manifest_self_digest": self.self_digest}

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


def manifest_self_digest(body: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of the manifest body (without `manifest_self_digest`)."""
    return self_digest(body, "manifest_self_digest")


def structure_problems(d: Any, schema_version: int, manifest_name: str, dict_fields: tuple[str, ...]) -> list[str]:
    """Every structural problem of a manifest's JSON form (empty: its shape is the one this qwenquant writes)."""
    if not isinstance(d, dict):
        return ["the top level is not a JSON object"]
    p: list[str] = []
    sv = d.get("schema_version")
    if sv != schema_version:
        p.append(f"schema_version is {sv!r}, this qwenquant reads {schema_version}")
    for key in ("root_digest", "recipe_sha256", "manifest_self_digest"):
        if not isinstance(d.get(key), str) or not HEX64.match(d[key]):
            p.append(f"{key} is missing or not 64 hex digits")
    for key in dict_fields:
        if not isinstance(d.get(key), dict):
            p.append(f"{key} is missing or not an object")
    known = {"schema_version", "root_digest", "files", "recipe_sha256", "manifest_self_digest", *dict_fields}
    p += [f"unknown key {k!r}" for k in sorted(set(d) - known)]
    files = d.get("files")
    if not isinstance(files, list):
        return p + ["files is missing or not a list"]
    seen: list[str] = []
    for i, f in enumerate(files):
        if not (isinstance(f, dict) and set(f) == {"path", "size", "sha256"}):
            p.append(f"files[{i}] must have exactly path, size, sha256")
            continue
        path, size, sha = f["path"], f["size"], f["sha256"]
        pp = PurePosixPath(path) if isinstance(path, str) else None
        if pp is None or not path or pp.is_absolute() or ".." in pp.parts or "\\" in path or str(pp) != path:
            p.append(f"files[{i}].path {path!r} is not a clean relative POSIX path")
        else:
            seen.append(path)
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            p.append(f"files[{i}].size {size!r} is not a non-negative integer")
        if not isinstance(sha, str) or not HEX64.match(sha):
            p.append(f"files[{i}].sha256 {sha!r} is not 64 hex digits")
    if seen != sorted(set(seen)):
        p.append("files are not sorted by path or repeat a path")
    if manifest_name in seen:
        p.append(f"files lists {manifest_name} itself")
    return p


def manifest_from_dict(d: Any) -> Manifest:
    """Build a Manifest from its JSON form; VerificationError naming every structural problem."""
    if isinstance(d, dict) and d.get("schema_version") == 1:
        raise VerificationError(
            f"{MANIFEST_NAME} is of schema_version 1 (an earlier qwenquant), whose root digest does not cover the "
            f"recipe and its serve profiles; this qwenquant reads schema_version {SCHEMA_VERSION}",
            hint="rebuild the artifact with this qwenquant (`qwenquant quantize` with the same options reuses its "
            "stage records) and publish it again; a downloaded one: ask the publisher to re-publish",
        )
    problems = structure_problems(d, SCHEMA_VERSION, MANIFEST_NAME, _DICT_FIELDS)
    if problems:
        raise VerificationError(
            f"{MANIFEST_NAME} is malformed: " + "; ".join(problems),
            hint="the manifest was edited or truncated; rebuild the artifact (`qwenquant quantize ...`) "
            "or restore the manifest from where the artifact came from",
        )
    return Manifest(
        files=tuple(FileDigest(f["path"], f["size"], f["sha256"]) for f in d["files"]),
        root_digest=d["root_digest"],
        recipe_sha256=d["recipe_sha256"],
        schema_version=d["schema_version"],
        **{k: d[k] for k in _DICT_FIELDS},
    )
