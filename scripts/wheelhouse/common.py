"""What the wheelhouse scripts share; standard library only (unpack.py runs on the GPU host's python,
plan.py and seal.py where the wheelhouse is built). Each script imports it from its own folder."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path


def norm(name: str) -> str:
    """PEP 503 normalized project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def sha256_of(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
