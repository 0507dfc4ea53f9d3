"""Shared fixtures: tiny Qwen3.5 checkpoints built in code, once per session."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The random-weights tiny checkpoint (seed 0). Read-only by convention: mutate `tiny_copy`."""
    from qwenquant.testbed.tiny import build_tiny_checkpoint

    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "random", variant="random", seed=0)


@pytest.fixture(scope="session")
def tiny_constant_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The constant tiny checkpoint: target and MTP head always predict `constant_token_id()`."""
    from qwenquant.testbed.tiny import build_tiny_checkpoint

    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "constant", variant="constant", seed=0)


@pytest.fixture
def tiny_copy(tiny_checkpoint: Path, tmp_path: Path) -> Path:
    """A fresh copy of the random tiny checkpoint that the test may change."""
    return Path(shutil.copytree(tiny_checkpoint, tmp_path / "tiny"))
