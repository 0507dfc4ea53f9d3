"""Decide a wheelhouse from pip's resolution report: which wheels to carry, which the host already
has, which were dropped, and which carried packages have a requirement the host does not meet.

Used by scripts/wheelhouse.sh (standard library + pip's vendored `packaging`, so it runs with any
python that has pip >= 23):

  python plan.py REPORT.json --python 3.12 --platform manylinux_2_31_x86_64 [--skip-installed LIST]
                 [--drop PATTERN ...] [--allow-unmet NAME[=REASON] ...] --out PLAN.json --keep KEEP.txt

Exit 1 with one line per problem when a carried package needs something the host lacks and the
package was not named with --allow-unmet.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import re
import sys
from pathlib import Path
from urllib.parse import unquote

try:
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.version import InvalidVersion, Version
except ImportError:  # pip always vendors it
    from pip._vendor.packaging.requirements import InvalidRequirement, Requirement  # type: ignore[no-redef]
    from pip._vendor.packaging.version import InvalidVersion, Version  # type: ignore[no-redef]

from common import norm


def read_host_list(text: str) -> dict[str, str | None]:
    """`pip freeze`-style lines -> {normalized name or glob: version or None}; comments ignored."""
    host: dict[str, str | None] = {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        m = re.match(r"^([A-Za-z0-9*?_.\-\[\]]+)\s*(?:===?\s*([^\s;]+))?", line)
        if not m:
            raise ValueError(f"cannot read the line {raw!r} (want NAME==VERSION or NAME)")
        name = m.group(1).split("[", 1)[0] if "*" not in m.group(1) else m.group(1)
        host[norm(name) if "*" not in name else name.lower()] = m.group(2)
    return host


def host_match(name: str, host: dict[str, str | None]) -> tuple[bool, str | None]:
    """(the host has it, its version or None) for a normalized project name."""
    if name in host:
        return True, host[name]
    for pattern, version in host.items():
        if "*" in pattern and fnmatch.fnmatch(name, pattern):
            return True, version
    return False, None


def marker_env(python: str, platform: str) -> dict[str, str]:
    """Environment markers of the target: CPython `python` on Linux `platform`."""
    machine = "x86_64" if platform.endswith("x86_64") else platform.rsplit("_", 1)[-1]
    if platform.endswith("aarch64"):
        machine = "aarch64"
    return {
        "python_version": python,
        "python_full_version": f"{python}.0",
        "implementation_name": "cpython",
        "implementation_version": f"{python}.0",
        "platform_python_implementation": "CPython",
        "os_name": "posix",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": machine,
        "platform_release": "",
        "platform_version": "",
        "extra": "",
    }


def applies(req: Requirement, env: dict[str, str], extras: list[str]) -> bool:
    if req.marker is None:
        return True
    return any(req.marker.evaluate({**env, "extra": e}) for e in (extras or [""]))


def satisfied(req: Requirement, version: str | None) -> bool:
    if version is None:
        return True  # a bare name in the host list: whatever it has counts
    try:
        return req.specifier.contains(Version(version), prereleases=True)
    except InvalidVersion:
        return False


def decide(
    report: dict, host: dict[str, str | None], drops: list[str], allow: dict[str, str], *, python: str, platform: str
) -> tuple[dict, list[str]]:
    """(plan, problems): the wheels to carry and why each other package is not carried."""
    env = marker_env(python, platform)
    items = {norm(i["metadata"]["name"]): i for i in report["install"]}
    keep, skipped, dropped = {}, [], []
    for name, item in items.items():
        version = item["metadata"]["version"]
        has, host_version = host_match(name, host)
        if has:
            why = f"the host has {name}" + (f" {host_version}" if host_version else "") + " (--skip-installed)"
            skipped.append({"name": name, "resolved_version": version, "reason": why})
        elif any(fnmatch.fnmatch(name, norm(p) if "*" not in p else p.lower()) for p in drops):
            dropped.append({"name": name, "resolved_version": version, "reason": "left out with --drop"})
        else:
            keep[name] = item
    dropped_names = {d["name"] for d in dropped}
    no_deps, problems = [], []
    for name, item in sorted(keep.items()):
        extras = item.get("requested_extras") or []
        for text in item["metadata"].get("requires_dist") or []:
            try:
                req = Requirement(text)
            except InvalidRequirement:
                continue
            dep = norm(req.name)
            if not applies(req, env, extras) or dep in keep:
                continue
            has, host_version = host_match(dep, host)
            if dep in dropped_names:
                why = f"requires {req}; {dep} is left out with --drop"
            elif has and not satisfied(req, host_version):
                why = f"requires {req}; the host has {dep} {host_version}"
            else:
                continue
            if dep not in dropped_names and name not in allow:
                problems.append(f"{name} {item['metadata']['version']} {why}")
                continue
            reason = allow.get(name) or ""
            no_deps.append(
                {
                    "name": name,
                    "version": item["metadata"]["version"],
                    "unmet": str(req),
                    "reason": why + (f": {reason}" if reason else ""),
                }
            )
    wheels = []
    for name, item in sorted(keep.items()):
        info = item["download_info"]
        hashes = (info.get("archive_info") or {}).get("hashes") or {}
        wheels.append(
            {
                "name": name,
                "version": item["metadata"]["version"],
                "filename": unquote(info["url"].rsplit("/", 1)[-1].split("#", 1)[0]),
                "index_sha256": hashes.get("sha256"),
            }
        )
    plan = {
        "wheels": wheels,
        "skipped": sorted(skipped, key=lambda d: d["name"]),
        "dropped": sorted(dropped, key=lambda d: d["name"]),
        "no_deps": no_deps,
    }
    return plan, problems


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("report")
    ap.add_argument("--python", required=True)
    ap.add_argument("--platform", required=True)
    ap.add_argument("--skip-installed")
    ap.add_argument("--drop", action="append", default=[])
    ap.add_argument("--allow-unmet", action="append", default=[])
    ap.add_argument("--out", required=True)
    ap.add_argument("--keep", required=True)
    a = ap.parse_args(argv)
    try:
        host = read_host_list(Path(a.skip_installed).read_text()) if a.skip_installed else {}
    except (OSError, ValueError) as e:
        print(f"error: --skip-installed {a.skip_installed}: {e}", file=sys.stderr)
        return 2
    allow = {}
    for spec in a.allow_unmet:
        name, _, reason = spec.partition("=")
        allow[norm(name)] = reason.strip()
    plan, problems = decide(
        json.loads(Path(a.report).read_text()), host, a.drop, allow, python=a.python, platform=a.platform
    )
    if problems:
        for p in problems:
            print(f"error: {p}", file=sys.stderr)
        print(
            "hint: if the package works without it (check the code that uses it), pass --allow-unmet NAME=REASON; "
            "else carry the dependency (take it off --skip-installed) or pick another vLLM version",
            file=sys.stderr,
        )
        return 1
    Path(a.out).write_text(json.dumps(plan, indent=2, sort_keys=True) + "\n")
    Path(a.keep).write_text("".join(f"{w['name']}=={w['version']}\n" for w in plan["wheels"]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
