"""The offline tools in scripts/ that made the committed tiny reference still reproduce what is
committed: the corpus digest in reference.json, the calibration set's texts, the model's dims."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from qwenquant import data_path
from qwenquant.testbed.tiny import reference_model

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
pytestmark = pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="the corpus is CPython 3.11's stdlib")


@pytest.fixture
def tools(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))  # what `python scripts/train_reference.py` does
    import train_reference

    import stdlib_corpus

    return stdlib_corpus, train_reference


def test_corpus_and_calibration_set_are_the_committed_ones(tools) -> None:
    stdlib_corpus, _ = tools
    corpus = stdlib_corpus.load_corpus()
    assert corpus.digest() == reference_model.reference_meta()["corpus_sha256"]
    lines = data_path("calibration", "tiny-reference.jsonl").read_text(encoding="utf-8").splitlines()
    assert [json.loads(x)["text"] for x in lines] == stdlib_corpus.calibration_samples(corpus)


def test_train_script_builds_the_committed_dims_and_runs_as_a_script(tools, capsys) -> None:
    _, train_reference = tools
    assert dataclasses.asdict(train_reference.DIMS) == reference_model.reference_meta()["dims"]
    with pytest.raises(SystemExit) as e:
        train_reference.main(["--help"])
    assert e.value.code == 0
    assert capsys.readouterr().out.startswith("usage: python scripts/train_reference.py [-h] --out OUT")
