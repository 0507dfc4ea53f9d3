"""Calibration stage: a pinned Hub dataset (loopback hub, real huggingface_hub client) and a local
jsonl give the same token ids and fingerprint; the fetched files are verified and kept."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from qwenquant import data_path
from qwenquant.recipe import CalibrationSpec, load_calibration_override


def _dataset_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "ds"
    (folder / "data").mkdir(parents=True)
    shutil.copy(data_path("calibration", "tiny-demo.jsonl"), folder / "data" / "train-00000-of-00001.jsonl")
    (folder / "README.md").write_text("tiny chat set\n")
    return folder


def test_hub_and_local_calibration_agree(hub, tiny_checkpoint: Path, tmp_path: Path) -> None:
    from qwenquant.quantize.stages.calibration import load_tokens, run_calibration, token_fingerprint

    commit = hub.add_repo("demo/tiny-chat", _dataset_folder(tmp_path), repo_type="dataset")
    hub_spec = CalibrationSpec(
        source="hub",
        dataset="demo/tiny-chat",
        revision=commit,
        split="train",
        text_field="messages",
        num_samples=32,
        max_length=256,
        chat_template=True,
        shuffle_seed=42,
    )
    (tmp_path / "hub-out").mkdir()
    info = run_calibration(hub_spec, tiny_checkpoint, tmp_path / "hub-out", datasets_dir=tmp_path / "datasets")
    assert info["dataset"] == "demo/tiny-chat" and info["revision"] == commit
    assert list(info["files"]) == ["data/train-00000-of-00001.jsonl"]
    fetched = tmp_path / "datasets" / f"demo--tiny-chat@{commit}"
    assert json.loads((fetched / "qwenquant-fetch.json").read_text())["commit"] == commit

    local_spec = load_calibration_override("tiny-demo")
    (tmp_path / "local-out").mkdir()
    local = run_calibration(local_spec, tiny_checkpoint, tmp_path / "local-out")
    assert info["fingerprint_sha256"] == local["fingerprint_sha256"]
    assert info["sample_ids"] == local["sample_ids"] and info["token_total"] == local["token_total"]
    samples = load_tokens(tmp_path / "hub-out")
    assert len(samples) == 32 and max(len(s) for s in samples) <= 256
    assert token_fingerprint(samples) == info["fingerprint_sha256"]


def test_unknown_split_is_reported(hub, tiny_checkpoint: Path, tmp_path: Path) -> None:
    from qwenquant.errors import StageError
    from qwenquant.quantize.stages.calibration import run_calibration

    commit = hub.add_repo("demo/tiny-chat", _dataset_folder(tmp_path), repo_type="dataset")
    spec = CalibrationSpec(
        source="hub",
        dataset="demo/tiny-chat",
        revision=commit,
        split="validation",
        text_field="messages",
        num_samples=4,
        max_length=64,
    )
    (tmp_path / "out").mkdir()
    with pytest.raises(StageError, match="no data files for split 'validation'"):
        run_calibration(spec, tiny_checkpoint, tmp_path / "out", datasets_dir=tmp_path / "datasets")


def test_missing_text_field_is_reported(tiny_checkpoint: Path, tmp_path: Path) -> None:
    from qwenquant.errors import StageError
    from qwenquant.quantize.stages.calibration import run_calibration

    data = tmp_path / "c.jsonl"
    data.write_text('{"prompt": "hello"}\n')
    spec = CalibrationSpec(source="local", path=str(data), text_field="text", num_samples=1, max_length=8)
    (tmp_path / "out").mkdir()
    with pytest.raises(StageError, match="no column 'text'"):
        run_calibration(spec, tiny_checkpoint, tmp_path / "out")
