"""atomic.py: a path that is not a regular file is written through, never renamed over."""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

from qwenquant.atomic import atomic_write_json


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
