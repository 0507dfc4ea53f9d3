"""The stage interface: what one quantize stage declares, and the context it reads.

A stage is one `Stage` object in its own module under `stages/`. `pipeline.quantize` walks a stage
list (default `stages.PIPELINE`) in order: for each stage it asks `inputs(ctx)` and `params(ctx)`
(what the completion record fingerprints), then, unless the record proves the stage complete,
calls `run(ctx, staging_dir)`, which builds the stage's output folder and returns its result dict.
Whatever else the pipeline needs from a stage the stage declares here: the manifest fields it
contributes, its inner progress bars, a check of the options before any folder is created, and a
note for `quantize --plan`. The pipeline reads no stage by name. Stages never write records or
the manifest; `pipeline.py` does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qwenquant.hashing import DigestCache
from qwenquant.quantize.timings import Timings

if TYPE_CHECKING:  # pydantic models; the CLI's --help path stays free of them
    from qwenquant.quantize.records import StageOutcome
    from qwenquant.recipe import CalibrationSpec, Recipe

# (stage, task, done, total). task None: the pipeline's own steps (stage `stage` starts as step
# `done` of `total`, then "manifest" and "done"); else one of the stage's declared `tasks`.
Progress = Callable[[str, str | None, int, int], None]


class NoOutcome(LookupError):
    """A stage asked for the outputs of a stage that has not run before it (in `quantize --plan`:
    one that would re-run, so its outputs are not known yet)."""

    def __init__(self, stage: str) -> None:
        super().__init__(f"no outcome of stage {stage!r} yet: a stage reads only earlier stages' outputs")
        self.stage = stage


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
    current: Stage | None = None  # the stage running now (set by the pipeline)
    # the run's file and tensor digests (the stage records' cache): what a stage hashes, a later one reuses
    digests: DigestCache = field(default_factory=DigestCache)
    # what the run measures of itself (QuantizeResult.timings): a stage adds its inner parts here
    timings: Timings = field(default_factory=Timings)

    def _outcome(self, stage: str) -> StageOutcome:
        if stage not in self.outcomes:
            raise NoOutcome(stage)
        return self.outcomes[stage]

    def dir(self, stage: str) -> Path:
        """The output folder of an earlier stage."""
        return self._outcome(stage).dir

    def digest(self, stage: str) -> str:
        """One digest over an earlier stage's outputs (what a later stage lists as its input)."""
        return self._outcome(stage).digest

    def result(self, stage: str) -> dict[str, Any]:
        """The result dict an earlier stage returned (as its record keeps it)."""
        return self._outcome(stage).result

    def progress_for(self, task: str) -> Callable[[int, int], None] | None:
        """A (done, total) callback for one of the running stage's declared `tasks`, or None when
        nobody listens."""
        stage = self.current
        if stage is None or task not in stage.tasks:
            raise ValueError(
                f"progress task {task!r} is not declared by stage {stage.name if stage else None!r} (Stage.tasks)"
            )
        report = self.progress
        return None if report is None else (lambda i, n: report(stage.name, task, i, n))


@dataclass(frozen=True)
class Stage:
    """One quantize stage: its name, what its record fingerprints, how it runs, and what it adds.

    `builds_checkpoint`: the stage's folder is a full checkpoint; the last such folder becomes the
    artifact.
    `manifest(outcome)`: the manifest fields this stage contributes, from its outcome (reused or
    just run): any of "source", "calibration" (dicts, taken whole) and "quality" (sections, merged
    with the other stages' sections); absent: none.
    `tasks`: the labels of the inner progress bars the stage reports (`ctx.progress_for(label)`).
    `preflight(source, recipe)`: checks the options before any folder is created (raises).
    `plan_note(ctx)`: for `quantize --plan`, when the stage would run: what it would resume from
    or what it would cost (None: nothing to add). Read-only, and cheap.
    `idle(result)`: True when the recipe asked nothing of the stage (reported "not asked", not "ran").
    `same_outputs(ctx, record)`: for `quantize --plan`, when the stage would run although its record is
    intact (its inputs or params differ): why the run will write exactly the outputs `record` lists (a
    moved source folder is a new path, not new files), or None when that is not known before it runs.
    The plan then checks the later stages against those outputs, as the run will.
    """

    name: str
    inputs: Callable[[StageContext], dict[str, str]]
    params: Callable[[StageContext], dict[str, Any]]
    run: Callable[[StageContext, Path], dict[str, Any]]
    builds_checkpoint: bool = False
    manifest: Callable[[StageOutcome], dict[str, Any]] | None = None
    tasks: tuple[str, ...] = ()
    preflight: Callable[[Path, Recipe], None] | None = None
    plan_note: Callable[[StageContext], str | None] | None = None
    idle: Callable[[dict[str, Any]], bool] | None = None  # from its result: the recipe asked nothing of it
    same_outputs: Callable[[StageContext, dict[str, Any]], str | None] | None = None
