"""Write the long-prompt text of `qwenquant bench depth` / `soak` / `turns` (src/qwenquant/data/depthtext/):
sources of a few Python standard-library modules that the tiny reference model was trained on
(scripts/stdlib_corpus.py), read from this interpreter's stdlib (CPython 3.11), and the YAML that
pins the text's sha256. The text is the Python Software Foundation's, under the PSF License v2.

    .venv/bin/python scripts/depth_text.py
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stdlib_corpus import HELDOUT, MODULES, stdlib_dir

PICK = ("argparse.py", "dataclasses.py", "difflib.py", "functools.py", "heapq.py", "string.py", "bisect.py")
OUT = Path(__file__).resolve().parents[1] / "src" / "qwenquant" / "data" / "depthtext"


def main() -> int:
    assert all(m in MODULES and m not in HELDOUT for m in PICK), "the text must be what the reference saw"
    root = stdlib_dir()
    parts = [
        f"# ---- Lib/{m} (CPython {sys.version_info.major}.{sys.version_info.minor}) ----\n"
        + (root / m).read_text(encoding="utf-8")
        for m in PICK
    ]
    text = "\n".join(parts)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "stdlib.txt").write_text(text, encoding="utf-8")
    meta = {
        "schema_version": 1,
        "file": "stdlib.txt",
        "sha256": hashlib.sha256(text.encode()).hexdigest(),
        "chars": len(text),
        "source": f"CPython {sys.version.split()[0]} Lib/: " + ", ".join(PICK),
        "license": "PSF-2.0",
        "notice": "Copyright (c) 2001-2023 Python Software Foundation; All Rights Reserved. Distributed under "
        "the Python Software Foundation License Version 2 (https://docs.python.org/3/license.html).",
    }
    (OUT / "depthtext.yaml").write_text(
        "# The text `qwenquant bench depth`, `soak` and `turns` prompt with (written by scripts/depth_text.py).\n"
        + yaml.safe_dump(meta, sort_keys=False, width=100)
    )
    print(f"{OUT / 'stdlib.txt'}: {len(text)} chars, sha256 {meta['sha256']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
