"""Pure decisions about a listing: which paths are safe, which files are refused, is the config ours."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from qwenquant.errors import FetchError

RECORD_NAME = "qwenquant-fetch.json"
STAGING_NAME = ".qwenquant-staging"

# Pickled weights (arbitrary code on load) and Python files (remote code) are never fetched.
REFUSED_SUFFIXES = (".py", ".pyc", ".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
SUPPORTED_ARCHITECTURES = frozenset({"Qwen3_5ForConditionalGeneration", "Qwen3_5ForCausalLM"})
SUPPORTED_MODEL_TYPES = frozenset({"qwen3_5", "qwen3_5_text"})


@dataclass(frozen=True)
class RemoteFile:
    """A file of the listing at the pinned commit."""

    path: str
    size: int
    blob_id: str  # git blob sha1 (of the LFS pointer for LFS files)
    sha256: str | None  # LFS files only

    @property
    def lfs(self) -> bool:
        return self.sha256 is not None

    @property
    def key(self) -> str:
        """A content key for staging names (partials of one content share it across runs)."""
        return self.sha256 or self.blob_id


def lfs_pointer_blob_id(sha256: str, size: int) -> str:
    """git blob id of the LFS pointer text for (sha256, size): ties the listing's `oid` to `lfs.oid`."""
    text = f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()
    return hashlib.sha1(f"blob {len(text)}\0".encode() + text).hexdigest()


def path_problem(path: str) -> str | None:
    """Why a listed path cannot be written safely under the out folder (None when it can)."""
    if not path or path.startswith(("/", "\\")) or (len(path) > 1 and path[1] == ":"):
        return "is absolute"
    if "\\" in path or "\0" in path:
        return "contains a backslash or NUL"
    parts = path.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return "has an empty, '.' or '..' segment"
    if parts[0] in (RECORD_NAME, STAGING_NAME):
        return "collides with qwenquant's own bookkeeping files"
    return None


def check_listing(files: Iterable[RemoteFile]) -> None:
    """Refuse unsafe paths, remote code and pickled weights; raise on the first one, naming it."""
    for f in sorted(files, key=lambda f: f.path):
        why = path_problem(f.path)
        if why:
            raise FetchError(f"refusing listed path {f.path!r}: it {why}", hint="the repo is not safe to fetch")
        if f.path.lower().endswith(REFUSED_SUFFIXES):
            kind = "Python code" if f.path.lower().endswith((".py", ".pyc")) else "pickled weights"
            raise FetchError(
                f"refusing {f.path}: {kind} is never fetched",
                hint="use a revision that ships only safetensors weights and JSON configs",
            )
        if f.lfs and f.blob_id != lfs_pointer_blob_id(f.sha256 or "", f.size):
            raise FetchError(
                f"listing of {f.path} is inconsistent: its git oid is not the LFS pointer of its sha256",
                hint="the server's listing cannot be trusted; check HF_ENDPOINT",
            )


def config_problems(name: str, config: Any, *, model_config: bool) -> list[str]:
    """Problems with a config JSON: remote code anywhere; for config.json, an unsupported model."""
    if not isinstance(config, dict):
        return [f"{name} is not a JSON object"]
    problems = []
    if "auto_map" in config or config.get("trust_remote_code"):
        problems.append(f"{name} asks for remote code (auto_map); qwenquant never runs repo code")
    if model_config:
        archs = config.get("architectures")
        mtype = config.get("model_type")
        if not (isinstance(archs, list) and archs and all(a in SUPPORTED_ARCHITECTURES for a in archs)):
            problems.append(
                f"{name}: architectures {archs!r} is not supported "
                f"(supported: {', '.join(sorted(SUPPORTED_ARCHITECTURES))})"
            )
        if mtype not in SUPPORTED_MODEL_TYPES:
            problems.append(f"{name}: model_type {mtype!r} is not qwen3_5")
    return problems
