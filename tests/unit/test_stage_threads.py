"""The eval stage computes with the thread count its inputs record (QWENQUANT_THREADS), like the gptq
and lm_head stages: also in a resumed run where eval is the only stage left, so nothing before it in
the process set the count."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch


class _Measured(Exception):
    """Stops the stage once the eval forwards would begin."""


def test_the_eval_stage_computes_with_qwenquant_threads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import qwenquant.evaluate.offline as offline
    import qwenquant.evaluate.texts as texts
    from qwenquant.quantize.stages import eval as eval_stage
    from qwenquant.recipe import load_recipe

    before, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    wanted = before + 1  # not the count the process has (torch's default: every core)
    monkeypatch.setenv("QWENQUANT_THREADS", str(wanted))
    seen: list[int] = []

    def run_offline(*_args: Any, **_kwargs: Any) -> dict[str, Any]:
        seen.append(torch.get_num_threads())
        raise _Measured

    monkeypatch.setattr(offline, "run_offline", run_offline)
    monkeypatch.setattr(texts, "resolve_windows", lambda *a, **k: (torch.zeros(1, 8, dtype=torch.long), {}))
    recipe = load_recipe("tiny-reference")  # a recipe with `eval:`
    assert recipe.eval is not None
    ctx = SimpleNamespace(
        recipe=recipe, source=tmp_path, work=tmp_path, device="cpu", dir=lambda name: tmp_path / name, digest=str
    )
    try:
        with pytest.raises(_Measured):
            eval_stage.STAGE.run(ctx, tmp_path / "out")
    finally:
        torch.set_num_threads(before)
        torch.use_deterministic_algorithms(deterministic)
    assert seen == [wanted]
    assert eval_stage.STAGE.inputs(ctx)["threads"] == str(wanted)  # the count it ran with is the one recorded
