"""The stage interface: what one quantize stage declares, and the context it reads.

A stage is one `Stage` object in its own module under `stages/`. `pipeline.quantize` walks
`stages.PIPELINE` in order: for each stage it asks `inputs(ctx)` and `params(ctx)` (what the
completion record fingerprints), then, unless the record proves the stage complete, calls
`run(ctx, staging_dir)`, which builds the stage's output folder and returns its result dict.
Stages never write records or the manifest; `pipeline.py` does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pydantic models; the CLI's --help path stays free of them
    from qwenquant.recipe import CalibrationSpec, Recipe
    from qwenquant.quantize.records import StageOutcome

Progress = Callable[[str, int, int], None]


@dataclass
class StageContext:
    """One quantize run as the stages see it: options, and the outcome of every stage so far."""

    source: Path
    recipe: Recipe
    calibration: CalibrationSpec
    work: Path
    device: str
    source_unverified: bool = False
    progress: Progress | None = None
    outcomes: dict[str, StageOutcome] = field(default_factory=dict)
    ranks: int = 1  # processes of the gptq stage (`quantize --gpus N`)

    def dir(self, stage: str) -> Path:
        """The output folder of an earlier stage."""
        return self.outcomes[stage].dir

    def digest(self, stage: str) -> str:
        """One digest over an earlier stage's outputs (what a later stage lists as its input)."""
        return self.outcomes[stage].digest

    def result(self, stage: str) -> dict[str, Any]:
        """The result dict an earlier stage returned (as its record keeps it)."""
        return self.outcomes[stage].result

    def progress_for(self, label: str) -> Callable[[int, int], None] | None:
        """A (done, total) callback for a stage's inner progress bar, or None when nobody listens."""
        report = self.progress
        return None if report is None else (lambda i, n: report(label, i, n))


@dataclass(frozen=True)
class Stage:
    """One quantize stage: its name, what its record fingerprints, and how it runs.

    `builds_checkpoint`: the stage's folder is a full checkpoint; the last such folder becomes the
    artifact.
    """

    name: str
    inputs: Callable[[StageContext], dict[str, str]]
    params: Callable[[StageContext], dict[str, Any]]
    run: Callable[[StageContext, Path], dict[str, Any]]
    builds_checkpoint: bool = False
