"""`qwenquant quantize --plan`: which stages a run would reuse or run, and why, without running any.

The same options, folder checks (nothing removed) and stage context as `pipeline.quantize`; for
each stage in order its inputs and params are computed and its completion record checked by the
same `records.check_record` the run uses, reading only. A reused stage's outcome comes from its
record, so later stages' inputs are exactly what the run would compute; a stage whose inputs read
the outputs of one that would re-run is itself reported as running ("gptq re-runs"): those outputs
are not known before it does, unless the stage can tell that its run rewrites exactly the outputs of
its record (`Stage.same_outputs`: the source stage after the source folder moved). Nothing is written, no lock is taken, no stage runs: the source is
not hashed and the calibration set not tokenized (the source stage's inputs are a stat
fingerprint and the fetch record's digest). Outputs of the stages are hashed, as the run does to
trust them; a stage may add a cheap note of its own (`Stage.plan_note`: the gptq resume point).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qwenquant.quantize.pipeline import QuantizeOptions, check_folders, new_context, stage_list
from qwenquant.quantize.records import StageOutcome, StageRunner
from qwenquant.quantize.stage import NoOutcome, Stage, StageContext


@dataclass(frozen=True)
class StagePlan:
    """One stage of the plan: reused, or run and why (`note`: what the stage itself adds)."""

    stage: str
    runs: bool
    reason: str = ""
    note: str | None = None

    def describe(self) -> str:
        if not self.runs:
            return "reused"
        return f"would run: {self.reason}" + (f"; {self.note}" if self.note else "")

    def to_dict(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "action": "run" if self.runs else "reuse",
            "reason": self.reason or None,
            "note": self.note,
        }


@dataclass
class QuantizePlan:
    artifact: Path
    work: Path
    device: str
    ranks: int
    stages: list[StagePlan] = field(default_factory=list)
    force_removes: list[str] = field(default_factory=list)  # what --force would remove first

    @property
    def would_run(self) -> list[str]:
        return [s.stage for s in self.stages if s.runs]

    def to_dict(self) -> dict[str, Any]:
        return {
            "artifact": str(self.artifact),
            "work": str(self.work),
            "device": self.device,
            "ranks": self.ranks,
            "stages": [s.to_dict() for s in self.stages],
            "would_run": self.would_run,
            "reused": [s.stage for s in self.stages if not s.runs],
            "force_removes": self.force_removes,
        }


def plan_quantize(opts: QuantizeOptions, *, stages: Sequence[Stage] | None = None) -> QuantizePlan:
    """What `quantize(opts, stages=stages)` would do, stage by stage; runs and writes nothing.
    Raises what the run would raise before its first stage (a refused source or --out)."""
    stages = stage_list(stages)
    source, out, work, removes = check_folders(opts, stages, dry_run=True)
    ctx = new_context(opts, source, work)
    runner = StageRunner(work)
    plan = QuantizePlan(out, work, ctx.device, ctx.ranks, force_removes=[f"{r.flag} {r.said}" for r in removes])
    for stage in stages:
        plan.stages.append(_stage_plan(stage, ctx, runner))
    return plan


def _stage_plan(stage: Stage, ctx: StageContext, runner: StageRunner) -> StagePlan:
    """Check one stage's record against what the run would compute; a reused stage's outcome
    joins `ctx` for the stages after it."""
    try:
        inputs, params = stage.inputs(ctx), stage.params(ctx)
    except NoOutcome as e:
        return StagePlan(stage.name, True, f"{e.stage} re-runs", _note(stage, ctx))
    rec, reason = runner.check(stage.name, inputs, params)
    if rec is None:
        note = _note(stage, ctx)
        same = _same_outputs(stage, ctx, runner)
        if same is not None:
            note = "; ".join(x for x in (note, same) if x)
        return StagePlan(stage.name, True, reason, note)
    ctx.outcomes[stage.name] = StageOutcome(stage.name, runner.work / stage.name, rec, False, "")
    return StagePlan(stage.name, False)


def _same_outputs(stage: Stage, ctx: StageContext, runner: StageRunner) -> str | None:
    """When the stage's run will write the outputs its intact record lists (`Stage.same_outputs`):
    that record's outcome joins `ctx`, and the line says why and what follows."""
    if stage.same_outputs is None or (rec := runner.intact_record(stage.name)) is None:
        return None
    try:
        why = stage.same_outputs(ctx, rec)
    except NoOutcome:
        return None
    if why is None:
        return None
    ctx.outcomes[stage.name] = StageOutcome(stage.name, runner.work / stage.name, rec, False, "")
    return f"its outputs stay those of its record ({why}), so the stages after it are checked against them"


def _note(stage: Stage, ctx: StageContext) -> str | None:
    if stage.plan_note is None:
        return None
    try:
        return stage.plan_note(ctx)
    except NoOutcome:  # it depends on outputs not known before an earlier stage re-runs
        return None
