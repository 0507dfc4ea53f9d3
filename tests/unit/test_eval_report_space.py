"""The eval report's folder is checked for free space before measuring.

MOCK: shutil.disk_usage is replaced to report a nearly full disk; filling a real disk (or mounting a
small one) is not possible in a test. The write-after-measuring path is tested for real against
/dev/full in tests/integration/test_eval_served_faults.py.
"""

from __future__ import annotations

import shutil
from collections import namedtuple
from pathlib import Path

import pytest

from qwenquant.errors import UsageError
from qwenquant.evaluate.inputs import check_report_target
from qwenquant.evaluate.report import DOC, KINDS
from qwenquant.reportdoc import REPORT_SPACE, check_report_path

Usage = namedtuple("Usage", "total used free")


def test_a_nearly_full_disk_is_refused_before_measuring(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "disk_usage", lambda _p: Usage(10**9, 10**9 - 4096, 4096))
    with pytest.raises(UsageError) as e:
        check_report_target(tmp_path / "r.json", {}, explicit=True, kind="offline")
    assert e.value.exit_code == 2
    assert str(e.value) == (
        f"--report {tmp_path / 'r.json'}: {tmp_path} has 4,096 bytes free, the report needs up to {REPORT_SPACE:,}"
    )
    monkeypatch.setattr(shutil, "disk_usage", lambda _p: Usage(10**9, 0, REPORT_SPACE))
    assert check_report_path(tmp_path / "r.json", DOC, "offline", kinds=KINDS, flag="--report") is True
    # a device is written through, unchecked
    assert check_report_path(Path("/dev/null"), DOC, "offline", kinds=KINDS, flag="--report") is False
