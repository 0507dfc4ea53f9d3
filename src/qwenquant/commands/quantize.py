"""`qwenquant quantize` and `qwenquant graft-mtp` (light imports only; the work is in quantize/pipeline.py,
quantize/status.py for --plan, quantize/graft.py)."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from qwenquant.commands._app import Device, HessianPrecision, app, on_interrupt

if TYPE_CHECKING:
    from rich.progress import TaskID

    from qwenquant.quantize.pipeline import QuantizeOptions
    from qwenquant.recipe import CalibrationSpec, Recipe


SourceDir = Annotated[
    Path,
    typer.Argument(
        exists=True,
        file_okay=False,
        help="Model folder written by `qwenquant fetch` (or any folder with --source-unverified).",
    ),
]
Hessian = Annotated[
    HessianPrecision | None,
    typer.Option(
        "--hessian-precision",
        help="GPTQ Hessian accumulation: tensor-core (bf16 inputs on tensor cores, float32 sums) or fp32 (llm-compressor's own float32 arithmetic). Default: the recipe's quantization.hessian_precision (tensor-core).",
    ),
]
GptqGpus = Annotated[
    str,
    typer.Option(
        "--gpus",
        help="Processes for the gptq stage, one GPU each (NCCL): a number or 'auto' (every visible GPU). With --device cpu: N CPU processes (gloo).",
    ),
]


@app.command("quantize")
def quantize_cmd(
    source: SourceDir,
    recipe: str = typer.Option("w4a16-int4head", "--recipe", help="Shipped recipe name or YAML path."),
    out: Path = typer.Option(..., "--out", help="Artifact folder to write (replaced when complete)."),
    calibration: str | None = typer.Option(
        None, "--calibration", help="Calibration set name or YAML path (default: the recipe's)."
    ),
    source_unverified: bool = typer.Option(
        False,
        "--source-unverified",
        help="Accept a local folder without a fetch record (hashed and recorded as unverified).",
    ),
    work: Path | None = typer.Option(
        None, "--work", help="Work folder for stage outputs and records (default: <out>.work)."
    ),
    device: Device | None = typer.Option(None, "--device", help="cpu or cuda (default: cuda when present)."),
    hessian_precision: Hessian = None,
    gpus: GptqGpus = "1",
    force: bool = typer.Option(
        False, "--force", help="Remove an existing --out / --work that is not this build's (says what it removes)."
    ),
    plan: bool = typer.Option(
        False, "--plan", help="Only say which stages would run or be reused, and why; runs and writes nothing."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the result (or the plan) as JSON on stdout."),
) -> None:
    """Quantize a Qwen3.5-architecture checkpoint into a verified W4A16 artifact (resumable).

    Stages: source, calibration, gptq, lm_head, mtp, textonly, check, eval (when the recipe has an `eval:` key), manifest. A re-run (after a
    crash or Ctrl-C) reuses every stage whose completion record still proves it complete; --plan says which those are.

    Examples:

      qwenquant quantize models/Qwen3.8-27B --recipe w4a16-int4head --out artifacts/q27b

      qwenquant quantize models/Qwen3.8-27B --recipe w4a16-int4head --out artifacts/q27b --plan

      qwenquant quantize models/tiny --source-unverified --calibration tiny-demo --out artifacts/tiny --json

      qwenquant quantize models/Qwen3.8-27B --recipe w4a16-int4head --out artifacts/q27b --gpus 2
    """
    from qwenquant.quantize.engine.ranks import parse_gpus

    n_gpus = parse_gpus(gpus)
    if device is Device.cpu:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # llm-compressor picks cuda whenever it is visible
    from qwenquant.quantize.pipeline import QuantizeOptions

    r, spec = _recipe_and_calibration(recipe, hessian_precision, calibration)
    opts = QuantizeOptions(
        source, r, spec, out, work, device.value if device else None, source_unverified, force, n_gpus
    )
    (_plan if plan else _run)(opts, as_json)


def _recipe_and_calibration(
    recipe: str, hessian_precision: HessianPrecision | None, calibration: str | None
) -> tuple[Recipe, CalibrationSpec]:
    """The recipe (--hessian-precision over its own) and the calibration set (--calibration over the recipe's),
    its data checked before anything runs."""
    from qwenquant.recipe import load_calibration_override, load_recipe

    r = load_recipe(recipe)
    if hessian_precision is not None:
        r = r.with_hessian_precision(hessian_precision.value)
    spec = load_calibration_override(calibration) if calibration else r.calibration
    from qwenquant.recipe.calibdata import check_calibration_data

    check_calibration_data(spec)
    return r, spec


def _run(opts: QuantizeOptions, as_json: bool) -> None:
    os.environ.setdefault("TQDM_DISABLE", "1")  # our progress bars replace llm-compressor's
    from qwenquant.console import console, print_json, stdout, step_progress
    from qwenquant.quantize.pipeline import quantize

    on_interrupt(lambda: resume_note(opts))
    with step_progress() as bars:
        tasks: dict[str, TaskID] = {}

        def progress(stage: str, task: str | None, i: int, n: int) -> None:
            key = task or "stages"  # one bar for the stages, one per task a stage declares
            if key not in tasks:
                tasks[key] = bars.add_task(key, total=n)
            bars.update(tasks[key], completed=i, total=n, description=task or f"stage {stage}")

        # stdout carries only the result: llm-compressor's loguru sink writes to sys.stdout
        with contextlib.redirect_stdout(sys.stderr):
            result = quantize(opts, progress)
    if as_json:
        print_json(result.to_dict())
        return
    _print_result(result, stdout)
    console.print(
        f"[green]done[/]: {sum(v == 'ran' for v in result.stages.values())} stage(s) ran, "
        f"{sum(v == 'skipped' for v in result.stages.values())} reused"
    )


def resume_note(opts: QuantizeOptions) -> str:
    """What an interrupted quantize leaves: the stages complete, and where a re-run resumes."""
    from qwenquant.quantize.stages import PIPELINE

    out = Path(opts.out).resolve()
    work = Path(opts.work).resolve() if opts.work else out.with_name(out.name + ".work")
    done = [s.name for s in PIPELINE if (work / f"{s.name}.record.json").is_file()]
    left = [s.name for s in PIPELINE if s.name not in done]
    if not left:
        return f"interrupted while writing the artifact; re-run the same command: every stage in {work} is reused"
    layers = len(list((work / "gptq-layers").glob("layer-*/record.json"))) if left[0] == "gptq" else 0
    within = f": gptq {_resume_point(opts, layers)}" if layers else ""
    return (
        f"interrupted in stage {left[0]}; {len(done)} of {len(PIPELINE)} stages complete in {work}"
        f"{' (' + ', '.join(done) + ')' if done else ''}. Re-run the same command to resume from stage "
        f"{left[0]}{within}"
    )


def _resume_point(opts: QuantizeOptions, layers: int) -> str:
    """The gptq resume point as `--plan` and the log say it (engine/layers.resume_point)."""
    from qwenquant.checkpoint.config import read_config, text_config
    from qwenquant.errors import QwenquantError
    from qwenquant.quantize.engine.layers import resume_point

    try:
        n = int(text_config(read_config(Path(opts.source_dir)))["num_hidden_layers"])
    except (QwenquantError, OSError, ValueError, KeyError, TypeError):
        return f"resumes after the {layers} decoder layer(s) recorded"
    return resume_point(layers, n)


def _plan(opts: QuantizeOptions, as_json: bool) -> None:
    from qwenquant.console import console, print_json, stdout
    from qwenquant.quantize.status import plan_quantize

    on_interrupt(lambda: "interrupted: quantize --plan stopped before it reported; it runs and writes nothing")

    p = plan_quantize(opts)
    if as_json:
        print_json(p.to_dict())
        return
    width = max(len(s.stage) for s in p.stages)
    stdout.print(f"work folder: {p.work}", markup=False)
    for line in p.force_removes:
        stdout.print(f"--force removes, once the source stage passed: {line}", markup=False)
    for s in p.stages:
        stdout.print(f"{s.stage:<{width}}  {s.describe()}", markup=False)
    console.print(
        f"plan: {len(p.would_run)} stage(s) would run, {len(p.stages) - len(p.would_run)} reused "
        "(nothing was run or written)"
    )


def _print_result(result, out) -> None:  # (QuantizeResult, rich Console): both imported in the command body
    from rich.table import Table

    out.print(f"artifact: {result.artifact}", markup=False)
    out.print(f"root digest: {result.root_digest}", markup=False)
    head = result.quality.get("lm_head", {})
    if head.get("gptq"):
        t = Table(title="lm_head quality (held-out tokens vs the bf16 head)")
        for col in ("method", "KL", "top-1 agreement"):
            t.add_column(col)
        for m in ("rtn", "gptq"):
            t.add_row(m, f"{head[m]['kl']:.6g}", f"{head[m]['top1']:.4f}")
        t.caption = (
            f"KL reduction {head['kl_reduction_pct']:.1f}%, {head['calibration_tokens']} calibration / "
            f"{head['heldout_tokens']} held-out tokens"
        )
        out.print(t)


@app.command("graft-mtp")
def graft_mtp_cmd(
    artifact: Path = typer.Argument(..., exists=True, file_okay=False, help="Quantized artifact folder."),
    source: Path = typer.Option(
        ..., "--source", exists=True, file_okay=False, help="The original (unquantized) model folder."
    ),
    check_only: bool = typer.Option(
        False, "--check-only", help="Only report; exit 5 when something is missing or different."
    ),
    force: bool = typer.Option(
        False, "--force", help="Remove files in the artifact folder that are not part of it (says what it removes)."
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Print the result (plan, written, root digest) as JSON on stdout."
    ),
) -> None:
    """Copy the bf16 MTP draft head (mtp.*) from the source into an artifact, byte-identical.

    Fixes the index and the quantization ignore list, re-writes the manifest and re-verifies.
    Running it again changes nothing. An int4 MTP head (recipe `mtp: {quantize: gptq}`) keeps its
    packed Linears; the rest of the head comes from the source.

    Examples:

      qwenquant graft-mtp artifacts/q27b --source models/Qwen3.8-27B

      qwenquant graft-mtp artifacts/q27b --source models/Qwen3.8-27B --check-only

      qwenquant graft-mtp artifacts/q27b --source models/Qwen3.8-27B --json
    """
    from qwenquant.console import print_json, stdout
    from qwenquant.errors import StageError
    from qwenquant.quantize.graft import graft_mtp

    on_interrupt(
        lambda: (
            f"interrupted: {artifact} is as it was or fully grafted, never half-written (the graft is "
            "built beside it and renamed into place in one step, and its partial copy is removed); "
            f"`qwenquant graft-mtp {artifact} --source {source} --check-only` says which"
        )
    )
    r = graft_mtp(artifact, source, check_only=check_only, force=force)
    if check_only and not r["nothing_to_do"]:
        raise StageError(
            f"MTP head incomplete in {artifact}: {r['plan']}",
            hint=f"run `qwenquant graft-mtp {artifact} --source {source}`",
        )
    if as_json:
        print_json(r)
    elif r["nothing_to_do"]:
        stdout.print("nothing to graft: every mtp.* tensor is present and byte-identical", markup=False)
    else:
        stdout.print(f"grafted: {r['plan']}; root digest {r['root_digest']}", markup=False)
