"""benchmarks/deepen_artifact.py: a deeper copy of an artifact for serving benchmarks. The copy must
verify, hold layer i's bytes at layer i + N, keep every other tensor byte-identical, and say in
its manifest where it came from."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from standin import build_standin_artifact

from helpers import qq, raw_tensors

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def artifact(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_standin_artifact(tiny_checkpoint, tmp_path_factory.mktemp("deepen") / "artifact")


def _deepen(artifact: Path, out: Path, layers: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.deepen_artifact", str(artifact), "--layers", str(layers), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )


def test_deeper_copy_verifies_and_repeats_the_layers(artifact: Path, tmp_path: Path) -> None:
    config = json.loads((artifact / "config.json").read_text())
    n = config["text_config"]["num_hidden_layers"]
    out = tmp_path / "deep"
    r = _deepen(artifact, out, 2 * n)
    assert r.returncode == 0, r.stderr
    assert qq("verify", str(out)).returncode == 0
    src, dst = raw_tensors(artifact), raw_tensors(out)
    deep_cfg = json.loads((out / "config.json").read_text())["text_config"]
    assert deep_cfg["num_hidden_layers"] == 2 * n
    layer = [k for k in src if ".layers.0." in k and not k.startswith("mtp.")]
    assert layer and all(dst[k.replace(".layers.0.", f".layers.{n}.")] == src[k] for k in layer)
    assert all(dst[k] == v for k, v in src.items())  # every original tensor, byte for byte
    assert len(dst) == len(src) + sum(1 for k in src if ".layers." in k and not k.startswith("mtp."))
    extra = json.loads((out / "qwenquant-manifest.json").read_text())["extra"]["derived_for_benchmark"]
    source_root = json.loads((artifact / "qwenquant-manifest.json").read_text())["root_digest"]
    assert extra["from_root_digest"] == source_root and extra["layers"] == 2 * n


def test_refuses_a_depth_that_changes_layer_types(artifact: Path, tmp_path: Path) -> None:
    n = json.loads((artifact / "config.json").read_text())["text_config"]["num_hidden_layers"]
    r = _deepen(artifact, tmp_path / "same", n)
    assert r.returncode != 0 and "is not deeper" in r.stderr
    assert not (tmp_path / "same").exists() and not (tmp_path / "same.partial").exists()
