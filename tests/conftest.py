"""Shared fixtures: tiny Qwen3.5 checkpoints built in code, once per session."""

from __future__ import annotations

import shutil
import signal
from pathlib import Path

import pytest


def pytest_configure(config: pytest.Config) -> None:
    """The commands the tests start take Ctrl-C as a user's terminal sends it. A shell without job control
    starts a background job (`make test &`, nohup in a script) with SIGINT ignored, and every child would
    inherit that: each Ctrl-C test would then fail as if the command ignored Ctrl-C. Python's own handler in
    this process is reset to the default in the children."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


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
