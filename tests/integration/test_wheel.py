"""qwenquant as a wheel, outside a checkout: build it from the tracked sources, install it into a
fresh venv, and from another folder list the shipped recipes and quantize the built-in tiny model.

The venv gets the heavy stack (torch, transformers, llm-compressor, ...) through a .pth line naming
the test interpreter's site-packages, put after the venv's own: a real install of those would
download gigabytes. Only their code is borrowed; qwenquant itself is the wheel's copy (checked),
the checkout's src/ is on no path, and no QWENQUANT_*_DIR override is set.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from helpers import REPO

pytestmark = pytest.mark.slow  # about a minute: a wheel build, a venv, a tiny quantize

SHIPPED = (
    "data/recipes/w4a16-int4head.yaml",
    "data/recipes/w4a16-int4head-multimodal.yaml",
    "data/recipes/tiny-reference.yaml",
    "data/calibration/tiny-demo.yaml",
    "data/calibration/tiny-demo.jsonl",
    "data/calibration/tiny-reference.yaml",
    "data/calibration/tiny-reference.jsonl",
    "data/evaltext/wikitext-2-test.yaml",
    "data/tiny-reference/model.safetensors",
    "bench/data/bench.yaml",
)


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: int = 900) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))} exited {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    return r


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built from a copy of the sources a build reads (no stale build/ folder of the checkout)."""
    tmp = tmp_path_factory.mktemp("wheel")
    tree = tmp / "tree"
    tree.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, tree / name)
    shutil.copytree(REPO / "src", tree / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            "-w",
            str(tmp / "dist"),
            str(tree),
        ],
        tmp,
        dict(os.environ),
    )
    (found,) = (tmp / "dist").glob("qwenquant-*.whl")
    return found


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """(venv folder, environment) with the wheel installed and the heavy stack borrowed."""
    root = tmp_path_factory.mktemp("venv") / "venv"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("QWENQUANT_")}
    env.update(
        {
            "QWENQUANT_NO_PROGRESS": "1",
            "QWENQUANT_THREADS": "2",
            "PYTHONHASHSEED": "0",
            "XDG_CACHE_HOME": str(root.parent / "cache"),
            "XDG_STATE_HOME": str(root.parent / "state"),
        }
    )
    _run([sys.executable, "-m", "venv", str(root)], root.parent, env)
    py = root / "bin" / "python"
    _run([str(py), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)], root.parent, env)
    purelib = _run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], root.parent, env)
    borrowed = [str(Path(p).resolve()) for p in site.getsitepackages()]
    Path(purelib.stdout.strip(), "zz-qwenquant-test-stack.pth").write_text("\n".join(borrowed) + "\n")
    return root, env


def test_the_wheel_ships_the_data_and_no_tool_or_test_code(wheel: Path) -> None:
    """The demo's download hub ships; the hub's uploads, store and fault switches (tests/support) do not."""
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"qwenquant/{f}" for f in SHIPPED} <= names
    assert "qwenquant/testbed/hubserver/server.py" in names
    assert not [
        n
        for n in names
        if n.startswith(("tests/", "scripts/", "benchmarks/", "support/"))
        or n.endswith(
            (
                "/train.py",
                "/stdlib_corpus.py",
                "/checkpoint/compare.py",
                "/testbed/tiny/reference.py",
                "/hubserver/uploads.py",
                "/hubserver/store.py",
                "/hubserver/faults.py",
            )
        )
    ]


def test_installed_wheel_runs_from_another_folder(venv: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    root, env = venv
    bin_ = root / "bin"
    where = _run([str(bin_ / "python"), "-c", "import qwenquant; print(qwenquant.__file__)"], tmp_path, env)
    assert Path(where.stdout.strip()).resolve().is_relative_to(root.resolve()), where.stdout

    listed = _run([str(bin_ / "qwenquant"), "recipe", "list"], tmp_path, env).stdout
    for name in ("w4a16-int4head ", "w4a16-int4head-multimodal ", "tiny-reference ", "tiny-demo "):
        assert name in listed, listed
    text_set = _run(
        [
            str(bin_ / "python"),
            "-c",
            "from qwenquant.evaluate.textset import load_text_set; print(load_text_set('wikitext-2-test').repo)",
        ],
        tmp_path,
        env,
    )
    assert text_set.stdout.strip() == "Salesforce/wikitext"

    _run([str(bin_ / "python"), "-m", "qwenquant.testbed.tiny", "tiny"], tmp_path, env)
    _run(
        [
            str(bin_ / "qwenquant"),
            "quantize",
            "tiny",
            "--source-unverified",
            "--calibration",
            "tiny-demo",
            "--out",
            "art",
            "--device",
            "cpu",
        ],
        tmp_path,
        env,
    )
    verified = _run([str(bin_ / "qwenquant"), "verify", "art"], tmp_path, env)
    assert verified.stdout.startswith("OK art: "), verified.stdout
    assert not (tmp_path / "recipes").exists() and not (tmp_path / "calibration").exists()
