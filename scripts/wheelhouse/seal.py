"""Finish a wheelhouse in STAGE/wheels: check each downloaded wheel against the index's sha256,
split the large ones into pieces, write wheelhouse.json and SHA256SUMS (scripts/wheelhouse.sh).

  python seal.py STAGE --requirement REQ --python X.Y --platform TAG [--split SIZE]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from common import sha256_of

_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}
PIECE = ".part-"
INSTALL_NOTE = (
    "The closure was resolved once, for this target, by scripts/wheelhouse.sh; "
    "scripts/install-vllm.sh --wheelhouse installs exactly these wheels with pip --no-index --no-deps "
    "beside the host's packages (torch, CUDA libraries, numpy: see skipped) and then runs pip check, "
    "which may report only the unmet requirements listed under no_deps."
)


def split_size(text: str) -> int:
    m = re.fullmatch(r"([0-9]+)([KMG]?)", text)
    if not m or int(m.group(1)) <= 0:
        raise ValueError(f"bad --split {text!r}")
    return int(m.group(1)) * _UNITS[m.group(2)]


def split_file(path: Path, size: int) -> list[str]:
    """Cut `path` into NAME.part-000, -001, ... of `size` bytes (the last shorter); remove it."""
    names = []
    with open(path, "rb") as f:
        for i, block in enumerate(iter(lambda: f.read(size), b"")):
            piece = path.with_name(f"{path.name}{PIECE}{i:03d}")
            piece.write_bytes(block)
            names.append(piece.name)
    path.unlink()
    return names


def seal(stage: Path, requirement: str, python: str, platform: str, split: int | None) -> list[str]:
    """Write wheelhouse.json and SHA256SUMS into stage/wheels; return problems (empty when fine)."""
    plan = json.loads((stage / "plan.json").read_text())
    wheels_dir = stage / "wheels"
    expected = {w["filename"] for w in plan["wheels"]}
    found = {p.name for p in wheels_dir.iterdir()}
    problems = [f"pip did not download {n}" for n in sorted(expected - found)]
    problems += [f"unexpected file {n} in the download folder" for n in sorted(found - expected)]
    if problems:
        return problems
    wheels = []
    for w in plan["wheels"]:
        path = wheels_dir / w["filename"]
        digest = sha256_of(path)
        if w.get("index_sha256") and w["index_sha256"] != digest:
            problems.append(f"{w['filename']}: sha256 {digest} is not the index's {w['index_sha256']}")
            continue
        entry = {
            "name": w["name"],
            "version": w["version"],
            "filename": w["filename"],
            "sha256": digest,
            "size": path.stat().st_size,
        }
        if split and entry["size"] > split:
            entry["pieces"] = split_file(path, split)
        wheels.append(entry)
    if problems:
        return problems
    info = {
        "schema_version": 1,
        "requirement": requirement,
        "python": python,
        "platform": platform,
        "install": INSTALL_NOTE,
        "wheels": wheels,
        "skipped": plan["skipped"],
        "dropped": plan["dropped"],
        "no_deps": plan["no_deps"],
        "split_bytes": split,
    }
    (wheels_dir / "wheelhouse.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    lines = [f"{sha256_of(p)}  {p.name}\n" for p in sorted(wheels_dir.iterdir())]
    (wheels_dir / "SHA256SUMS").write_text("".join(lines))
    return []


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("stage", type=Path)
    ap.add_argument("--requirement", required=True)
    ap.add_argument("--python", required=True)
    ap.add_argument("--platform", required=True)
    ap.add_argument("--split")
    a = ap.parse_args(argv)
    problems = seal(a.stage, a.requirement, a.python, a.platform, split_size(a.split) if a.split else None)
    for p in problems:
        print(f"error: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
