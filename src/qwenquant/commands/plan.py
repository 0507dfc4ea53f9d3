"""`qwenquant plan` (light imports; the work is in qwenquant.plan)."""

from __future__ import annotations

import os
from pathlib import Path

import typer

from qwenquant.commands._app import Split, app


@app.command()
def plan(
    target: Path = typer.Argument(..., exists=True, help="Artifact folder, or a config.json (or a folder holding one)."),
    gpu_mem: str = typer.Option("24GiB", "--gpu-mem", help="GPU memory to plan for, e.g. 24GiB."),
    recipe: str | None = typer.Option(None, help="Recipe for a bare config (default w4a16-int4head)."),
    profile: list[str] = typer.Option([], "--profile", "-p", help="Only these profiles (default: all)."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    gpus: int = typer.Option(1, "--gpus", min=1, help="GPUs to split the model over; figures are per GPU."),
    split: Split = typer.Option(Split.tensor, "--split", help="With --gpus N: tensor (every layer split over the "
                                "GPUs) or pipeline (each GPU holds a run of whole layers: one budget per stage)."),
) -> None:
    """Memory budget per component and per serve profile: what fits on the GPU, what to lower.

    Per profile on a GPU: the largest single prompt and the largest burst of new prompts that fill,
    with the Gated DeltaNet prefill transient (which vLLM's own sizing leaves out) counted.

    A profile whose max-model-len is above the model's max_position_embeddings does not fit either:
    serve refuses it (unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1). Exits 7 when no profile fits, naming
    the first reason.

    Examples:

      qwenquant plan artifacts/q27b --gpu-mem 24GiB

      qwenquant plan models/Qwen3.8-27B/config.json --recipe w4a16-int4head

      qwenquant plan artifacts/q27b --gpus 2 --gpu-mem 24GiB

      qwenquant plan artifacts/q27b --gpus 2 --split pipeline --gpu-mem 24GiB
    """
    from qwenquant.console import print_json
    from qwenquant.errors import ServeError
    from qwenquant.plan.artifact import make_plan
    from qwenquant.plan.gpumem import parse_size
    from qwenquant.plan.pipeline import PARTITION_ENV
    from qwenquant.plan.report import budget_dict, budget_lines, first_reason, pipeline_lines, stage_name, weights_lines

    pp = gpus if split is Split.pipeline else 1
    res = make_plan(target, parse_size(gpu_mem), recipe_name=recipe, profiles=profile or None, tp=gpus // pp,
                    pp=pp, partition=os.environ.get(PARTITION_ENV))
    where = f"GPU memory {gpu_mem}" if gpus == 1 else \
        f"{gpus} GPUs of {gpu_mem} each under {split.value} parallelism, figures per GPU"
    if as_json:
        print_json({"source": res.source, "tensor_parallel_size": gpus // pp, "pipeline_parallel_size": pp,
                    "weights": res.weights.bytes,
                    "stage_weights": [w.bytes for w in res.stage_weights] or None,
                    "profiles": {k: budget_dict(b, res.shape) | {"fits": res.fits(k), "position_problem": res.refused.get(k)}
                                 | ({"stages": [budget_dict(x, res.shape) for x in res.stages[k]]} if pp > 1 else {})
                                 for k, b in res.budgets.items()}})
    else:
        lines = [f"plan for {res.source}, {where}"] + weights_lines(res.weights, res.include_vision)
        for k, w in enumerate(res.stage_weights):
            lines += [""] + [f"pipeline stage {k}: {line}" if i == 0 else line
                             for i, line in enumerate(weights_lines(w, res.include_vision))]
        for name, b in res.budgets.items():
            for i, x in enumerate(res.stages.get(name, [b])):
                shown = budget_lines(name, x, res.shape, refused=res.refused.get(name), positions=res.positions)
                if i == 0 and name in res.refused:  # before the memory figures, which hold whatever the positions
                    shown.insert(1, f"  DOES NOT FIT: {res.refused[name]}, which serve refuses: {res.position_fix}")
                lines += [""] + shown
            if pp > 1:
                lines += [""] + pipeline_lines(name, res.stages[name], res.shape, refused=res.refused.get(name))
        typer.echo("\n".join(lines))
    if res.budgets and not any(res.fits(k) for k in res.budgets):
        name, b = next(iter(res.budgets.items()))
        if name in res.refused:
            raise ServeError(f"no serve profile fits: {res.refused[name]} (profile {name})", hint=res.position_fix)
        where = f" ({stage_name(b)})" if pp > 1 else ""
        raise ServeError(f"no serve profile fits in {gpu_mem}{' per GPU' if gpus > 1 else ''}: {first_reason(b)} "
                         f"(profile {name}{where})",
                         hint="plan for a GPU with more memory, or lower the settings each profile names")
