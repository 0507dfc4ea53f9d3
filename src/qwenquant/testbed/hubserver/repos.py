"""What the loopback hub serves: repos, commits (content-derived ids) and branches."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from qwenquant.hashing import CHUNK
from qwenquant.manifest import FETCH_RECORD_NAME

# Extensions the Hub stores through LFS (a subset of the default .gitattributes of a new repo).
LFS_SUFFIXES = (
    ".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle", ".h5", ".msgpack", ".onnx",
    ".gguf", ".npy", ".npz", ".arrow", ".parquet", ".tar", ".gz", ".zip", ".zst", ".model", ".tflite",
)  # fmt: skip
LFS_NAMES = ("tokenizer.json",)  # large text files the Hub commonly tracks in LFS


def is_lfs_path(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return name.endswith(LFS_SUFFIXES) or name in LFS_NAMES


def lfs_pointer(sha256: str, size: int) -> bytes:
    """The git-lfs pointer file text for a blob (what git actually stores for an LFS file)."""
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()


@dataclass(frozen=True)
class HubFile:
    """One file of a commit: where its bytes live on disk and its digests."""

    path: str  # repo-relative POSIX path
    source: Path
    size: int
    sha256: str
    blob_id: str  # git blob sha1 of the content, or of the LFS pointer for LFS files
    lfs: bool

    @property
    def pointer_size(self) -> int:
        return len(lfs_pointer(self.sha256, self.size))


@dataclass
class Commit:
    sha: str
    files: dict[str, HubFile]
    title: str = "qwenquant hubserver commit"


@dataclass
class Repo:
    repo_id: str
    repo_type: str  # "model" | "dataset"
    commits: dict[str, Commit] = field(default_factory=dict)
    branches: dict[str, str] = field(default_factory=dict)
    private: bool = False  # reads without an Authorization header answer 401
    lfs: dict[str, Path] = field(
        default_factory=dict
    )  # uploaded LFS objects (sha256 -> bytes on disk), committed or not


def scan_file(source: Path, rel: str, lfs: bool | None = None) -> HubFile:
    """Hash one file (sha256 and git blob sha1 in one pass)."""
    size = source.stat().st_size
    h256 = hashlib.sha256()
    h1 = hashlib.sha1(f"blob {size}\0".encode())
    with open(source, "rb") as f:
        while chunk := f.read(CHUNK):
            h256.update(chunk)
            h1.update(chunk)
    sha = h256.hexdigest()
    use_lfs = is_lfs_path(rel) if lfs is None else lfs
    blob = git_blob_id(lfs_pointer(sha, size)) if use_lfs else h1.hexdigest()
    return HubFile(path=rel, source=source, size=size, sha256=sha, blob_id=blob, lfs=use_lfs)


# What `qwenquant fetch` keeps for itself in a folder it wrote: never part of the repo such a folder serves
# (a fetch refuses a repo listing them).
FETCH_BOOKKEEPING = (FETCH_RECORD_NAME, ".qwenquant-staging")


def scan_folder(folder: Path) -> dict[str, HubFile]:
    """Every regular file under `folder` (symlinks are followed, hidden `.git`/`.cache` skipped, and so is
    the fetch record and staging area of a folder `qwenquant fetch` wrote: it serves the repo it holds)."""
    folder = Path(folder)
    files: dict[str, HubFile] = {}
    for root, dirs, names in os.walk(folder):
        top = Path(root) == folder
        dirs[:] = sorted(d for d in dirs if d not in (".git", ".cache") and not (top and d in FETCH_BOOKKEEPING))
        for name in sorted(names):
            if top and name in FETCH_BOOKKEEPING:
                continue
            p = Path(root) / name
            rel = p.relative_to(folder).as_posix()
            files[rel] = scan_file(p, rel)
    return files


def gitattributes() -> bytes:
    """The .gitattributes a new Hub repo starts with (its LFS patterns)."""
    lines = [f"*{s} filter=lfs diff=lfs merge=lfs -text" for s in LFS_SUFFIXES]
    lines += [f"{n} filter=lfs diff=lfs merge=lfs -text" for n in LFS_NAMES]
    return ("\n".join(lines) + "\n").encode()


def commit_id(files: dict[str, HubFile], parent: str | None = None) -> str:
    """A 40-hex commit id derived from the content (and parent), like a git commit id."""
    h = hashlib.sha1(b"qwenquant-hubserver-commit\n")
    h.update(f"parent {parent or ''}\n".encode())
    for path in sorted(files):
        h.update(f"{files[path].blob_id} {path}\n".encode())
    return h.hexdigest()
