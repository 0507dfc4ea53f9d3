"""Guards for inputs a recipe file cannot carry but code can: a hub calibration spec built without a
pinned revision, a head calibration without a Hessian, a tokenizer without the tiny model's added
tokens. Each is refused in one line before any work, never carried on with a None."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qwenquant.errors import StageError
from qwenquant.recipe.models import CalibrationSpec


def test_a_hub_calibration_spec_without_a_pinned_revision_is_refused(tmp_path: Path) -> None:
    """A recipe file is validated (hub needs both); a spec made in code skips that: without a
    revision the fetch would take whatever the dataset's main branch holds today."""
    from qwenquant.quantize.stages.calibration import fetch_hub_dataset

    spec = CalibrationSpec.model_construct(source="hub", dataset="me/texts", revision=None, num_samples=1, max_length=8)
    with pytest.raises(StageError) as e:
        fetch_hub_dataset(spec, tmp_path)
    assert "needs `dataset` and a pinned `revision`" in e.value.message and "None" in e.value.message
    assert e.value.exit_code == 5 and not any(tmp_path.iterdir())  # nothing fetched, nothing created


def test_a_head_calibration_without_a_hessian_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from qwenquant.quantize.engine import headcal
    from qwenquant.quantize.stages import lm_head

    empty = headcal.HeadCalibration(hessian=None, tokens=0, heldout=None, heldout_samples=0)
    monkeypatch.setattr(headcal, "load", lambda prev_dir: empty)
    with pytest.raises(StageError, match="the head calibration holds no Hessian"):
        lm_head._calibration(tmp_path, [], None, tmp_path, "cpu")  # the spec is not reached


def test_a_tokenizer_without_the_added_tokens_is_refused() -> None:
    from qwenquant.testbed.tiny import tokenizer

    doc = json.loads(tokenizer.tokenizer_json())
    dropped = doc["added_tokens"].pop()["content"]
    doc["model"]["vocab"].pop(dropped, None)
    with pytest.raises(RuntimeError, match="lacks the added tokens"):
        tokenizer.token_ids(json.dumps(doc))
