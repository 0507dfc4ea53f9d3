"""Interrupted fetches resume: nothing verified is downloaded again, partials resume or restart."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from qwenquant.fetch import load_fetch_record

from helpers import run_cli
from support.hubserver import Fault

REPO = "Qwen/Qwen3.8-27B"
SHARD1 = "model-00001-of-00002.safetensors"
SHARD2 = "model-00002-of-00002.safetensors"


def fetch(capsys, out: Path, *extra: str) -> tuple[int, str]:
    code, _, err = run_cli(capsys, "fetch", REPO, "--out", str(out), *extra)
    return code, err


def partials(out: Path) -> list[Path]:
    return sorted((out / ".qwenquant-staging").glob("*.part"))


def leave_partial(served, capsys, out: Path, at: int = 1_000_000) -> Path:
    """Run a fetch that dies on SHARD1 after `at` bytes arrived; return the partial it left."""
    served.hub.faults.add(Fault("truncate", path=SHARD1, at=at))
    served.hub.faults.add(Fault("fail", path=SHARD1, times=None, skip=2))  # resolve#1, blob#1 pass
    code, err = fetch(capsys, out)
    assert code == 3 and SHARD1 in err
    (part,) = partials(out)
    assert part.stat().st_size == at
    served.hub.faults.clear()
    served.hub.clear_log()
    return part


def test_interrupted_after_k_files_downloads_only_the_rest(served, tmp_path: Path, capsys, disk) -> None:
    out = tmp_path / "out"
    served.hub.faults.add(Fault("fail", path=SHARD2, times=None))
    code, err = fetch(capsys, out)
    assert code == 3 and f"error: {SHARD2}" in err
    assert disk.final_files(out) == {}  # nothing moves into place before the whole snapshot verifies
    staged = out / ".qwenquant-staging" / "tree"
    disk.assert_only_verified(staged, served.source)
    done_before = set(disk.final_files(staged))
    assert SHARD2 not in done_before and len(done_before) == 9
    served.hub.faults.clear()
    served.hub.clear_log()
    code, err = fetch(capsys, out)
    assert code == 0, err
    assert [r.file for r in served.hub.downloads()] == [SHARD2]
    disk.assert_identical_copy(out, served.source)


def test_leftover_partial_resumes_with_range(served, tmp_path: Path, capsys, disk) -> None:
    out = tmp_path / "out"
    leave_partial(served, capsys, out)
    code, err = fetch(capsys, out)
    assert code == 0, err
    (blob,) = served.hub.downloads()
    assert (blob.file, blob.range, blob.status) == (SHARD1, "bytes=1000000-", 206)
    assert blob.sent == (served.source / SHARD1).stat().st_size - 1_000_000
    disk.assert_identical_copy(out, served.source)
    assert not (out / ".qwenquant-staging").exists()


def test_partial_with_wrong_prefix_restarts_from_zero_once(served, tmp_path: Path, capsys, disk) -> None:
    out = tmp_path / "out"
    part = leave_partial(served, capsys, out)
    data = bytearray(part.read_bytes())
    data[123_456] ^= 0xFF
    part.write_bytes(bytes(data))
    code, err = fetch(capsys, out)
    assert code == 0, err
    assert [(r.file, r.range) for r in served.hub.downloads()] == [(SHARD1, "bytes=1000000-"), (SHARD1, None)]
    disk.assert_identical_copy(out, served.source)


def test_complete_partial_is_not_appended_to(served, tmp_path: Path, capsys, disk) -> None:
    out = tmp_path / "out"
    staging = out / ".qwenquant-staging"
    staging.mkdir(parents=True)
    f1, f2 = served.hub.file(REPO, SHARD1), served.hub.file(REPO, SHARD2)
    (staging / f"{f1.sha256}.aaaa.part").write_bytes((served.source / SHARD1).read_bytes())
    (staging / f"{f2.sha256}.bbbb.part").write_bytes((served.source / SHARD2).read_bytes() + b"junk")
    code, err = fetch(capsys, out)
    assert code == 0, err
    files = [r.file for r in served.hub.downloads()]
    assert SHARD1 not in files  # the complete partial verified as it was
    assert [(r.file, r.range) for r in served.hub.downloads(SHARD2)] == [(SHARD2, None)]  # oversize: dropped
    disk.assert_identical_copy(out, served.source)


def test_rerun_downloads_nothing_and_repairs_a_changed_file(served, tmp_path: Path, capsys, disk) -> None:
    out = tmp_path / "out"
    assert fetch(capsys, out)[0] == 0
    served.hub.clear_log()
    assert fetch(capsys, out)[0] == 0
    assert served.hub.downloads() == []
    data = bytearray((out / SHARD2).read_bytes())
    data[-1] ^= 0x01
    (out / SHARD2).write_bytes(bytes(data))
    code, err = fetch(capsys, out)
    assert code == 0 and f"{SHARD2} differs from the listing" in err
    assert [r.file for r in served.hub.downloads()] == [SHARD2]
    disk.assert_identical_copy(out, served.source)


def test_interrupted_run_keeps_its_commit_unless_re_resolve(served, tmp_path: Path, capsys, disk) -> None:
    out = tmp_path / "out"
    leave_partial(served, capsys, out)
    newer = tmp_path / "newer"
    newer.mkdir()
    (newer / "config.json").write_bytes((served.source / "config.json").read_bytes())
    new = served.hub.add_commit(REPO, newer, branch="main")
    code, err = fetch(capsys, out)
    assert code == 0 and f"reusing commit {served.commit}" in err
    assert load_fetch_record(out)["commit"] == served.commit
    disk.assert_identical_copy(out, served.source)
    code, err = fetch(capsys, out, "--re-resolve")
    assert code == 0, err
    assert load_fetch_record(out)["commit"] == new
    assert sorted(disk.final_files(out)) == ["config.json"]  # files of the old commit were ours: removed


def test_killed_process_resumes(served, tmp_path: Path, capsys, disk) -> None:
    """A real SIGKILL mid-download: the partial on disk is resumed, nothing unverified is in place."""
    out = tmp_path / "out"
    served.hub.faults.add(Fault("slow", path=SHARD1, rate=1_000_000))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    proc = subprocess.Popen([sys.executable, "-m", "qwenquant", "fetch", REPO, "--out", str(out)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if (out / ".qwenquant-staging" / "tree" / SHARD2).exists() and any(
                p.stat().st_size > 500_000 for p in partials(out)
            ):
                break
            time.sleep(0.05)
        else:
            pytest.fail("the fetch never got going")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    disk.assert_only_verified(out, served.source)
    assert not (out / "qwenquant-fetch.json").exists()
    size = max(p.stat().st_size for p in partials(out))
    served.hub.faults.clear()
    served.hub.clear_log()
    code, err = fetch(capsys, out)
    assert code == 0, err
    assert [(r.file, r.range) for r in served.hub.downloads()] == [(SHARD1, f"bytes={size}-")]
    disk.assert_identical_copy(out, served.source)
