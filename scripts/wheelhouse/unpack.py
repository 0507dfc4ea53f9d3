"""The installer's half of a wheelhouse (scripts/install-vllm.sh --wheelhouse); standard library only.

  python unpack.py check DIR OUT   check every file against SHA256SUMS, the python version and the
                                   host's skipped packages; rebuild split wheels into OUT (each
                                   checked against wheelhouse.json); print the wheel paths
  python unpack.py pipcheck DIR    read `pip check` output on stdin; print the lines that are not
                                   about a requirement wheelhouse.json lists as knowingly unmet
  python unpack.py summary DIR     one line: the requirement, its wheel count, what is left unmet

Errors are one line, `error: ...`, exit 1; nothing is written to OUT before every check passed.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import shutil
import sys
from pathlib import Path

from common import norm, sha256_of


class Refused(Exception):
    pass


def read_sums(folder: Path) -> dict[str, str]:
    sums = folder / "SHA256SUMS"
    if not sums.is_file():
        raise Refused(f"{sums} is missing: is {folder} a wheelhouse made by scripts/wheelhouse.sh?")
    out = {}
    for n, line in enumerate(sums.read_text().splitlines(), 1):
        m = re.fullmatch(r"([0-9a-f]{64}) [ *]([^/\\]+)", line.strip())
        if not m:
            raise Refused(f"{sums} line {n} is not `SHA256  NAME`: {line[:80]!r}")
        out[m.group(2)] = m.group(1)
    return out


def check_files(folder: Path) -> dict:
    """Every listed file present with its sha256, nothing unlisted; the parsed wheelhouse.json."""
    sums = read_sums(folder)
    for name, digest in sorted(sums.items()):
        path = folder / name
        if not path.is_file():
            raise Refused(f"{path} is listed in SHA256SUMS but missing; copy it again")
        if sha256_of(path) != digest:
            raise Refused(f"{path} is corrupted: its sha256 does not match SHA256SUMS; copy it again")
    extra = sorted(p.name for p in folder.iterdir() if p.name not in sums and p.name != "SHA256SUMS")
    if extra:
        raise Refused(f"{folder / extra[0]} is not listed in SHA256SUMS; remove it or rebuild the wheelhouse")
    if "wheelhouse.json" not in sums:
        raise Refused(f"{folder}/wheelhouse.json is not listed in SHA256SUMS")
    return json.loads((folder / "wheelhouse.json").read_text())


def check_host(info: dict) -> None:
    """This python is the one the wheelhouse was built for, and has every package it left out."""
    have = f"{sys.version_info.major}.{sys.version_info.minor}"
    if have != info["python"]:
        raise Refused(
            f"the wheelhouse is for python {info['python']}, this python ({sys.executable}) is {have}; "
            f"set PYTHON to the host's python {info['python']}"
        )
    missing = []
    for s in info["skipped"]:
        try:
            importlib.metadata.distribution(s["name"])
        except importlib.metadata.PackageNotFoundError:
            missing.append(s["name"])
    if missing:
        raise Refused(
            f"{sys.executable} lacks {', '.join(missing)}, which the wheelhouse left out as installed on "
            "the host; set PYTHON to the python that has them, or rebuild without them in --skip-installed"
        )


def rebuild(folder: Path, info: dict, out: Path) -> list[Path]:
    """Whole wheels in `out`: split ones joined from their pieces and checked; others linked or copied."""
    paths = []
    for w in info["wheels"]:
        dest = out / w["filename"]
        if w.get("pieces"):
            with open(dest, "wb") as f:
                for piece in w["pieces"]:
                    with open(folder / piece, "rb") as src:
                        shutil.copyfileobj(src, f, 1 << 20)
            if sha256_of(dest) != w["sha256"]:
                raise Refused(
                    f"{w['filename']} joined from {len(w['pieces'])} pieces does not match its sha256 "
                    "in wheelhouse.json; rebuild the wheelhouse"
                )
        else:
            try:
                dest.hardlink_to(folder / w["filename"])
            except OSError:
                shutil.copyfile(folder / w["filename"], dest)
        paths.append(dest)
    return paths


def tolerated(info: dict) -> set[tuple[str, str]]:
    """(package, dependency) pairs the wheelhouse knowingly leaves unmet."""
    pairs = set()
    for d in info["no_deps"]:
        dep = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", d["unmet"])
        if dep:
            pairs.add((norm(d["name"]), norm(dep.group(0))))
    return pairs


def unexpected_pip_check(lines: list[str], info: dict) -> list[str]:
    """`pip check` lines about our wheels that the wheelhouse did not list as knowingly unmet."""
    ours = {norm(w["name"]) for w in info["wheels"]}
    ok = tolerated(info)
    out = []
    for line in lines:
        m = re.match(r"(\S+) \S+ (?:requires ([A-Za-z0-9._-]+)|has requirement ([A-Za-z0-9._-]+))", line)
        if not m or norm(m.group(1)) not in ours:
            continue
        if (norm(m.group(1)), norm(m.group(2) or m.group(3))) not in ok:
            out.append(line)
    return out


def main(argv: list[str]) -> int:
    try:
        if len(argv) == 3 and argv[0] == "check":
            folder, out = Path(argv[1]), Path(argv[2])
            info = check_files(folder)
            check_host(info)
            for p in rebuild(folder, info, out):
                print(p)
        elif len(argv) == 2 and argv[0] == "pipcheck":
            info = json.loads((Path(argv[1]) / "wheelhouse.json").read_text())
            for line in unexpected_pip_check(sys.stdin.read().splitlines(), info):
                print(line)
        elif len(argv) == 2 and argv[0] == "summary":
            info = json.loads((Path(argv[1]) / "wheelhouse.json").read_text())
            unmet = "; ".join(f"{d['name']} {d['reason']}" for d in info["no_deps"]) or "none"
            print(f"{info['requirement']}: {len(info['wheels'])} wheels; installed with a requirement unmet: {unmet}")
        else:
            print(__doc__, file=sys.stderr)
            return 2
    except Refused as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
