"""scripts/wheelhouse.sh and scripts/install-vllm.sh --wheelhouse, offline, on small real wheels.

The wheels are made here (a wheel is a zip with a dist-info folder; pip installs them for real):
qqa needs qqb, hostpkg>=1 and qqold; qqold pins hostpkg<2; qqb carries 300 KB of random bytes so it
is split. The "host" is a venv that has hostpkg 2.0, as a GPU host has its own torch and numpy.
pip runs with no config file and --no-index: only the local folder of wheels is reachable.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAYLOAD = os.urandom(300 * 1024)


def make_wheel(folder: Path, name: str, version: str, requires: list[str], files: dict[str, bytes]) -> Path:
    """A py3-none-any wheel of `files` (path in site-packages -> bytes) with its dist-info."""
    dist = f"{name}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires
    )
    entries = {
        **files,
        f"{dist}/METADATA": meta.encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: qwenquant-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = ""
    for path, data in entries.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record += f"{path},sha256={digest},{len(data)}\n"
    out = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
        for path, data in entries.items():
            z.writestr(path, data)
        z.writestr(f"{dist}/RECORD", record + f"{dist}/RECORD,,\n")
    return out


@pytest.fixture(scope="module")
def links(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("links")
    make_wheel(d, "qqa", "1.0", ["qqb>=1", "hostpkg>=1", "qqold"], {"qqa/__init__.py": b"import qqb, qqold\n"})
    make_wheel(d, "qqb", "1.0", [], {"qqb/__init__.py": b"", "qqb/payload.bin": PAYLOAD})
    make_wheel(d, "qqold", "1.0", ["hostpkg<2"], {"qqold/__init__.py": b""})
    for v in ("1.0", "2.0"):
        make_wheel(d, "hostpkg", v, [], {"hostpkg/__init__.py": f"VERSION = '{v}'\n".encode()})
    return d


def offline_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", **extra)
    env.pop("CI", None)
    return env


def build(links: Path, out: Path, *more: str) -> subprocess.CompletedProcess:
    host_list = out.parent / "host-freeze.txt"
    host_list.write_text("# pip freeze on the host\nhostpkg==2.0\n")
    cmd = [
        "bash",
        str(ROOT / "scripts/wheelhouse.sh"),
        "--python",
        f"{sys.version_info[0]}.{sys.version_info[1]}",
        "--platform",
        "manylinux_2_28_x86_64",
        "--spec",
        "qqa==1.0",
        "--skip-installed",
        str(host_list),
        "--split",
        "100K",
        "--find-links",
        str(links),
        "--no-index",
        "--out",
        str(out),
        *more,
    ]
    return subprocess.run(cmd, env=offline_env(PYTHON=sys.executable), capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def wheelhouse(links: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wh") / "wheelhouse"
    r = build(links, out, "--allow-unmet", "qqold=only imported by tests")
    assert r.returncode == 0, r.stderr
    return out


@pytest.fixture(scope="module")
def host_python(links: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A python with hostpkg 2.0 installed: the host's own packages."""
    venv = tmp_path_factory.mktemp("host") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(venv / "bin/python"),
            "install",
            "-q",
            "--no-index",
            "--find-links",
            str(links),
            "hostpkg==2.0",
        ],
        check=True,
        env=offline_env(),
        timeout=120,
    )
    return venv / "bin/python"


def install(wheelhouse: Path, host_python: Path, venv: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(ROOT / "scripts/install-vllm.sh"), "--wheelhouse", str(wheelhouse)],
        env=offline_env(PYTHON=str(host_python), QWENQUANT_VLLM_VENV=str(venv)),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_wheelhouse_holds_the_closure_minus_the_host(wheelhouse, links):
    info = json.loads((wheelhouse / "wheelhouse.json").read_text())
    assert info["requirement"] == "qqa==1.0" and info["platform"] == "manylinux_2_28_x86_64"
    assert sorted(w["name"] for w in info["wheels"]) == ["qqa", "qqb", "qqold"]
    assert info["skipped"] == [
        {"name": "hostpkg", "resolved_version": "1.0", "reason": "the host has hostpkg 2.0 (--skip-installed)"}
    ]
    assert info["no_deps"] == [
        {
            "name": "qqold",
            "version": "1.0",
            "unmet": "hostpkg<2",
            "reason": "requires hostpkg<2; the host has hostpkg 2.0: only imported by tests",
        }
    ]
    qqb = next(w for w in info["wheels"] if w["name"] == "qqb")
    assert qqb["sha256"] == hashlib.sha256((links / qqb["filename"]).read_bytes()).hexdigest()
    assert [p.split(".part-")[1] for p in qqb["pieces"]] == ["000", "001", "002", "003"]
    assert not (wheelhouse / qqb["filename"]).exists()
    joined = b"".join((wheelhouse / p).read_bytes() for p in qqb["pieces"])
    assert joined == (links / qqb["filename"]).read_bytes()
    listed = {line.split()[1] for line in (wheelhouse / "SHA256SUMS").read_text().splitlines()}
    assert listed == {p.name for p in wheelhouse.iterdir()} - {"SHA256SUMS"}
    r = subprocess.run(["sha256sum", "-c", "--quiet", "SHA256SUMS"], cwd=wheelhouse, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_an_unmet_pin_needs_allow_unmet(links, tmp_path):
    r = build(links, tmp_path / "wh")
    assert r.returncode == 1
    assert "error: qqold 1.0 requires hostpkg<2; the host has hostpkg 2.0" in r.stderr
    assert "--allow-unmet" in r.stderr
    assert not (tmp_path / "wh").exists() and not list(tmp_path.glob("wh.partial*"))


def test_install_from_the_wheelhouse_offline(wheelhouse, host_python, tmp_path):
    venv = tmp_path / "venv-vllm"
    r = install(wheelhouse, host_python, venv)
    assert r.returncode == 0, r.stderr
    py = str(venv / "bin/python")
    probe = (
        "import qqa, qqb, hostpkg, importlib.resources as r, importlib.metadata as m; "
        "print(hostpkg.VERSION, m.version('qqa'), hostpkg.__file__); "
        "open(__import__('sys').argv[1], 'wb').write(r.files('qqb').joinpath('payload.bin').read_bytes())"
    )
    out = subprocess.run([py, "-c", probe, str(tmp_path / "payload")], capture_output=True, text=True, check=True)
    version, qqa_version, hostpkg_file = out.stdout.split()
    assert (version, qqa_version) == ("2.0", "1.0")  # the host's hostpkg is used, not carried
    assert not hostpkg_file.startswith(str(venv))
    assert (tmp_path / "payload").read_bytes() == PAYLOAD  # the split wheel, joined byte-identical
    assert "qqold requires hostpkg<2; the host has hostpkg 2.0: only imported by tests" in r.stderr
    assert not (venv / "qwenquant-vllm.json").exists()  # not vLLM: no launcher


def test_a_corrupted_piece_is_refused(wheelhouse, host_python, tmp_path):
    bad = Path(shutil.copytree(wheelhouse, tmp_path / "wh"))
    piece = next(bad.glob("qqb-*.part-001"))
    data = bytearray(piece.read_bytes())
    data[1000] ^= 0xFF
    piece.write_bytes(bytes(data))
    venv = tmp_path / "venv-vllm"
    r = install(bad, host_python, venv)
    assert r.returncode != 0
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: {piece} is corrupted: its sha256 does not match SHA256SUMS; copy it again"]
    assert not venv.exists()  # nothing was installed
