"""Hub fixtures: a real loopback HTTP hub serving a tiny checkpoint (or taking uploads), an artifact to publish,
signing keys, and helpers to check the result; the trained tiny reference quantized once per session for the
real-vLLM eval modules (each copies it: eval writes its reports beside the artifact)."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import Disk, make_keys, write_test_manifest
from support.hubserver import HubServer

REPO = "Qwen/Qwen3.8-27B"


@dataclass
class Served:
    hub: HubServer
    repo_id: str
    commit: str
    source: Path


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """A started HubServer; HF_ENDPOINT points at it, no token, no Xet, fast retries."""
    with HubServer() as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
        # huggingface_hub reads the variable once, at import: a test that imported it earlier in this process
        # (transformers does) would leave Xet on, and uploads would ask the loopback hub for Xet tokens
        hub_constants = sys.modules.get("huggingface_hub.constants")
        if hub_constants is not None:
            monkeypatch.setattr(hub_constants, "HF_HUB_DISABLE_XET", True)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
        monkeypatch.delenv("HF_TOKEN", raising=False)
        monkeypatch.setenv("QWENQUANT_FETCH_BACKOFF", "0.01")
        monkeypatch.setenv("QWENQUANT_NO_PROGRESS", "1")
        yield server


@pytest.fixture
def served(hub: HubServer, tiny_copy: Path) -> Served:
    """The tiny checkpoint served as Qwen/Qwen3.8-27B@main."""
    return Served(hub, REPO, hub.add_repo(REPO, tiny_copy), tiny_copy)


@pytest.fixture
def disk() -> type[Disk]:
    """File checks of a fetched folder (tests/helpers.Disk)."""
    return Disk


@pytest.fixture
def artifact(tiny_copy: Path) -> Path:
    """The tiny checkpoint with a manifest over its files: an artifact that verifies (no quantize needed here)."""
    write_test_manifest(tiny_copy)
    return tiny_copy


@pytest.fixture
def hub_w(hub, monkeypatch: pytest.MonkeyPatch):
    """The loopback hub with a write token in HF_TOKEN, as the Hub client reads it."""
    monkeypatch.setenv("HF_TOKEN", "hf_loopback_write")
    return hub


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, Path]:
    try:
        import model_signing  # noqa: F401
    except ImportError:
        if os.environ.get("CI") == "true":
            pytest.fail("model_signing is missing under CI=true: install qwenquant[sign]")
        pytest.skip("model_signing not installed (pip install 'qwenquant[sign]')")
    return make_keys(tmp_path / "publisher")


@pytest.fixture(scope="session")
def reference_w4a16(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The trained tiny reference quantized with w4a16-int4head and its own calibration set, by the real CLI.
    Read-only: a module copies it (shutil.copytree) before serving or evaluating it."""
    import subprocess

    from qwenquant.testbed.tiny import reference_model

    from helpers import vllm_env

    tmp = tmp_path_factory.mktemp("reference-w4a16")
    src = reference_model.build_reference_checkpoint(tmp / "source")
    art = tmp / "artifact"
    q = subprocess.run(
        [
            sys.executable,
            "-m",
            "qwenquant",
            "quantize",
            str(src),
            "--source-unverified",
            "--recipe",
            "w4a16-int4head",
            "--calibration",
            "tiny-reference",
            "--out",
            str(art),
        ],
        env=dict(vllm_env(tmp), QWENQUANT_THREADS="2"),
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert q.returncode == 0, q.stderr[-3000:]
    return art
