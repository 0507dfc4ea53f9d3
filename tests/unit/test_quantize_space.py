"""The free-space refusal before the first stage says its figures in units a reader can tell apart."""

from __future__ import annotations

import shutil
from collections import namedtuple
from pathlib import Path

import pytest

from qwenquant.errors import StageError
from qwenquant.quantize.space import check_free_space
from qwenquant.recipe import load_recipe


def test_a_small_disk_is_said_in_mib(tiny_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiny model's stages write a few MiB; a disk with 1 MiB free. A stand-in for the disk (no small
    filesystem can be mounted without root): shutil.disk_usage answers 1 MiB free."""
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda _: usage(2**20, 0, 2**20))
    with pytest.raises(StageError) as e:
        check_free_space(
            tiny_checkpoint,
            tmp_path / "q",
            tmp_path / "q.work",
            load_recipe("tiny-reference"),
            ["gptq", "lm_head", "mtp", "textonly"],
        )
    assert "GiB" not in e.value.message and "but only 1.0 MiB is free on" in e.value.message, e.value.message
    assert " MiB, but only" in e.value.message
