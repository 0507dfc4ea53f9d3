"""Hub fixtures: a real loopback HTTP hub serving a tiny checkpoint, and helpers to check the result."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from qwenquant.testbed.hubserver import HubServer

REPO = "Qwen/Qwen3.8-27B"
BOOKKEEPING = ("qwenquant-fetch.json", ".qwenquant-staging")


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
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
        monkeypatch.delenv("HF_TOKEN", raising=False)
        monkeypatch.setenv("QWENQUANT_FETCH_BACKOFF", "0.01")
        monkeypatch.setenv("QWENQUANT_NO_PROGRESS", "1")
        yield server


@pytest.fixture
def served(hub: HubServer, tiny_copy: Path) -> Served:
    """The tiny checkpoint served as Qwen/Qwen3.8-27B@main."""
    return Served(hub, REPO, hub.add_repo(REPO, tiny_copy), tiny_copy)


class Disk:
    """File checks the fetch tests share (a fixture, since test modules cannot import conftest)."""

    @staticmethod
    def sha256(path: Path) -> str:
        return sha256(path)

    final_files = staticmethod(lambda out: final_files(out))
    assert_only_verified = staticmethod(lambda out, source: assert_only_verified(out, source))
    assert_identical_copy = staticmethod(lambda out, source: assert_identical_copy(out, source))


@pytest.fixture
def disk() -> type[Disk]:
    return Disk


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def final_files(out: Path) -> dict[str, Path]:
    """Files at a final path (qwenquant's own record and staging area left out)."""
    found = {}
    for root, dirs, names in os.walk(out):
        dirs[:] = [d for d in dirs if d not in BOOKKEEPING]
        for n in names:
            p = Path(root) / n
            rel = p.relative_to(out).as_posix()
            if rel not in BOOKKEEPING:
                found[rel] = p
    return found


def assert_only_verified(out: Path, source: Path) -> None:
    """Every file at a final path is byte-identical to the source's file of that path."""
    for rel, p in final_files(out).items():
        assert (source / rel).is_file(), f"{rel} is at a final path but not in the source"
        assert sha256(p) == sha256(source / rel), f"{rel} at its final path is not the source's bytes"


def assert_identical_copy(out: Path, source: Path) -> None:
    assert sorted(final_files(out)) == sorted(final_files(source))
    assert_only_verified(out, source)
    assert (out / "qwenquant-fetch.json").is_file()
