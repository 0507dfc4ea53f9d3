"""Code the test modules share: the CLI run in a subprocess or in-process, text flattening, and
raw tensor reads through the project's own safetensors reader."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
INDEX = "model.safetensors.index.json"


def qq(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess (fixed thread count: byte-identical results across runs)."""
    env = dict(os.environ, QWENQUANT_THREADS="2", QWENQUANT_NO_PROGRESS="1", PYTHONHASHSEED="0")
    return subprocess.run([sys.executable, "-m", "qwenquant", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=REPO)


def flat(text: str) -> str:
    """Whitespace runs as one space: rich wraps long lines at 80 columns off-terminal."""
    return " ".join(text.split())


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Run the CLI in-process: (exit code, stdout, stderr flattened)."""
    from qwenquant.cli import main

    capsys.readouterr()
    code = main(list(args))
    cap = capsys.readouterr()
    return code, cap.out, flat(cap.err)


def raw_tensors(folder: Path) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    """name -> (dtype, shape, raw bytes) of every tensor in every *.safetensors file of `folder`."""
    from qwenquant.checkpoint.tensorfile import shard_refs

    out = {}
    for f in sorted(Path(folder).glob("*.safetensors")):
        out.update({n: (r.dtype, r.shape, r.read()) for n, r in shard_refs(f).items()})
    return out


def mtp_bytes(folder: Path) -> dict[str, bytes]:
    """The raw bytes of every mtp.* tensor in `folder`."""
    return {n: data for n, (_, _, data) in raw_tensors(folder).items() if n.startswith("mtp.")}


def strip_mtp(folder: Path) -> None:
    """Remove the MTP head as a quantized save without it would look: its shard and index entries."""
    index = json.loads((folder / INDEX).read_text())
    for shard in {v for k, v in index["weight_map"].items() if k.startswith("mtp.")}:
        (folder / shard).unlink()
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if not k.startswith("mtp.")}
    (folder / INDEX).write_text(json.dumps(index))
