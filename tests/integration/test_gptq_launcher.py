"""The N-process gptq launcher under the real torch.distributed.run, 2 gloo ranks on the CPU: a
rank's error reaches the stage as one line naming the rank (through the error file torchrun's
`@record` writes, and torchrun's ChildFailedError), and nothing is left behind.

The job is one the worker cannot run (its job.json names no source folder), so every rank fails
right after joining the job; tests/integration/test_distributed_gptq.py runs real jobs.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from qwenquant.errors import StageError
from qwenquant.quantize.engine.launch import RESUME_HINT, run_job


def test_a_failing_rank_is_reported_by_rank_through_torchrun(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("QWENQUANT_THREADS", "2")
    progress: list[tuple[int, int]] = []
    with pytest.raises(StageError) as e:
        run_job({"device": "cpu", "samples": [[1, 2, 3]]}, 2, tmp_path, lambda i, n: progress.append((i, n)))
    assert re.fullmatch(r"gptq rank [01] of 2: KeyError: 'source_dir'", e.value.message), e.value.message
    assert e.value.hint == RESUME_HINT and e.value.exit_code == 5
    assert progress == [] and os.listdir(tmp_path) == []  # the job folder (error files, logs) is gone
