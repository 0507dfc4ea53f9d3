"""The shape of `qwenquant-manifest.json` (manifest.py reads it through here): the keys, their types, the
file list's clean, sorted, relative paths, sizes and hex digests. Digests themselves are checked by verify."""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Any

HEX64 = re.compile(r"^[0-9a-f]{64}$")


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
