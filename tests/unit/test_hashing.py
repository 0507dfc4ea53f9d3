"""The run's digest cache (hashing.DigestCache): a file version or tensor byte range is read once
in a run, and a file changed since (in place or replaced) is read again."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from qwenquant import hashing
from qwenquant.hashing import DigestCache, sha256_files


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, int]]:
    """Every (file name, start, end) the cache reads: hashing.sha256_file and sha256_range wrapped."""
    seen: list[tuple[str, int, int]] = []
    real_file, real_range = hashing.sha256_file, hashing.sha256_range

    def sha256_file(p: Path, progress=None) -> str:
        seen.append((Path(p).name, 0, Path(p).stat().st_size))
        return real_file(p, progress)

    def sha256_range(p: Path, start: int, end: int) -> str:
        seen.append((Path(p).name, start, end))
        return real_range(p, start, end)

    monkeypatch.setattr(hashing, "sha256_file", sha256_file)
    monkeypatch.setattr(hashing, "sha256_range", sha256_range)
    return seen


def test_digest_cache_reads_only_files_it_has_not_hashed_in_this_run(tmp_path: Path) -> None:
    """The manifest reuses the digests a stage record took of the same inodes (hard links), and reads
    every other file: a new file, a copy, and a file rewritten since."""
    stage, art = tmp_path / "stage", tmp_path / "art"
    stage.mkdir()
    art.mkdir()
    for name in ("a.safetensors", "b.safetensors", "c.json"):
        (stage / name).write_bytes(name.encode() * 1000)
    cache = DigestCache()
    cache.folder(stage)  # what the stage record hashed
    for name in ("a.safetensors", "b.safetensors"):
        os.link(stage / name, art / name)
    (art / "c.json").write_bytes((stage / "c.json").read_bytes())  # a copy: another inode
    (art / "quality.json").write_bytes(b"{}")
    (stage / "b.safetensors").unlink()
    (art / "b.safetensors").write_bytes(b"changed")  # rewritten after the record: new inode, size, mtime
    read: list[str] = []

    def hasher(paths: list[Path]) -> dict[Path, str]:
        read.extend(p.name for p in paths)
        return sha256_files(paths)

    paths = sorted(art.iterdir())
    got = cache.files(paths, hasher)
    assert sorted(read) == ["b.safetensors", "c.json", "quality.json"]
    assert got == {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}


def test_a_file_rewritten_in_place_with_the_same_size_is_read_again(tmp_path: Path, reads: list) -> None:
    f = tmp_path / "shard.safetensors"
    f.write_bytes(b"a" * 4096)
    cache = DigestCache()
    first = cache.file(f)
    assert cache.file(f) == first and cache.range(f, 0, 4096) == first and len(reads) == 1  # whole file = [0, size)
    ino, mtime = f.stat().st_ino, f.stat().st_mtime_ns
    with open(f, "r+b") as fh:  # same inode, same size, other bytes
        fh.write(b"b")
    os.utime(f, ns=(f.stat().st_atime_ns, mtime + 1))  # a new mtime even on a coarse clock
    assert f.stat().st_ino == ino
    assert cache.file(f) == hashlib.sha256(b"b" + b"a" * 4095).hexdigest() != first
    assert len(reads) == 2


def test_a_file_grown_in_place_is_read_again_for_every_range(tmp_path: Path, reads: list) -> None:
    f = tmp_path / "shard.safetensors"
    f.write_bytes(bytes(range(256)) * 4)
    cache = DigestCache()
    tensor = cache.range(f, 8, 72)
    assert tensor == hashlib.sha256(f.read_bytes()[8:72]).hexdigest()
    assert cache.range(f, 8, 72) == tensor and cache.range(f, 72, 136) != tensor
    assert reads == [("shard.safetensors", 8, 72), ("shard.safetensors", 72, 136)]
    with open(f, "ab") as fh:  # the same bytes in that range, but the file changed: not trusted
        fh.write(b"more")
    assert cache.range(f, 8, 72) == tensor
    assert reads[-1] == ("shard.safetensors", 8, 72) and len(reads) == 3


def test_a_hard_link_reuses_the_digest_and_a_copy_does_not(tmp_path: Path, reads: list) -> None:
    f = tmp_path / "layer.safetensors"
    f.write_bytes(b"x" * 100)
    cache = DigestCache()
    cache.range(f, 10, 20)
    os.link(f, tmp_path / "linked.safetensors")
    (tmp_path / "copy.safetensors").write_bytes(f.read_bytes())
    assert cache.range(tmp_path / "linked.safetensors", 10, 20) == cache.range(tmp_path / "copy.safetensors", 10, 20)
    assert [r[0] for r in reads] == ["layer.safetensors", "copy.safetensors"]
