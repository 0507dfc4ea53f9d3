"""atomic.py: a path that is not a regular file is written through, never renamed over; files and folders get
the modes the umask gives, without flipping the process-wide umask."""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

import pytest

from qwenquant.atomic import atomic_write_bytes, atomic_write_json, staging_dir


def test_a_fifo_is_written_through_not_replaced(tmp_path: Path) -> None:
    """`--report /dev/null` and friends: a rename over a device or FIFO would turn it into a regular
    file (for /dev/null: for every process on the machine). A FIFO stands in for the device here."""
    fifo = tmp_path / "sink"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    atomic_write_json(fifo, {"x": 1})
    reader.join(timeout=10)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert json.loads(got[0]) == {"x": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sink"]  # no temporary file left beside it


def test_files_and_folders_get_the_umask_modes_without_flipping_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The umask is one value for the whole process: set to 0 for a moment (to read it) while the GPTQ writer
    thread writes, any file another thread creates in that moment is world-writable. Such a race cannot be
    provoked on demand, so a spy wrapped around os.umask stands in for it: writing calls it never, and the
    modes still follow the umask the user set (0o027 here: 0640 files, 0750 folders)."""
    calls: list[int] = []
    real = os.umask
    old = real(0o027)
    try:
        monkeypatch.setattr(os, "umask", lambda m: calls.append(m) or real(m))
        atomic_write_bytes(tmp_path / "file.bin", b"x")
        with staging_dir(tmp_path / "folder") as d:
            (d / "inner.bin").write_bytes(b"y")
    finally:
        real(old)
    assert calls == []
    assert stat.S_IMODE((tmp_path / "file.bin").stat().st_mode) == 0o640
    assert stat.S_IMODE((tmp_path / "folder").stat().st_mode) == 0o750
