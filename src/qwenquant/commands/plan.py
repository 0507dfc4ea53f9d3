"""`qwenquant plan` (light imports; the work is in qwenquant.plan)."""

from __future__ import annotations

from pathlib import Path

import typer

from qwenquant.commands._app import app


@app.command()
def plan(
    target: Path = typer.Argument(..., exists=True, help="Artifact folder, or a config.json (or a folder holding one)."),
    gpu_mem: str = typer.Option("24GiB", "--gpu-mem", help="GPU memory to plan for, e.g. 24GiB."),
    recipe: str | None = typer.Option(None, help="Recipe for a bare config (default w4a16-int4head)."),
    profile: list[str] = typer.Option([], "--profile", "-p", help="Only these profiles (default: all)."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    gpus: int = typer.Option(1, "--gpus", min=1, help="GPUs under vLLM tensor parallelism; figures are per GPU."),
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
    """
    from qwenquant.console import print_json
    from qwenquant.errors import ServeError
    from qwenquant.plan.artifact import make_plan
    from qwenquant.plan.gpumem import parse_size
    from qwenquant.plan.report import budget_dict, budget_lines, first_reason, weights_lines

    res = make_plan(target, parse_size(gpu_mem), recipe_name=recipe, profiles=profile or None, tp=gpus)
    where = f"{gpus} GPUs of {gpu_mem} each under tensor parallelism, figures per GPU" if gpus > 1 else \
        f"GPU memory {gpu_mem}"
    if as_json:
        print_json({"source": res.source, "tensor_parallel_size": gpus, "weights": res.weights.bytes,
                    "profiles": {k: budget_dict(b, res.shape) | {"fits": res.fits(k), "position_problem": res.refused.get(k)}
                                 for k, b in res.budgets.items()}})
    else:
        lines = [f"plan for {res.source}, {where}"] + weights_lines(res.weights, res.include_vision)
        for name, b in res.budgets.items():
            shown = budget_lines(name, b, res.shape)
            if name in res.refused:  # before the memory figures, which hold whatever the positions
                shown.insert(1, f"  DOES NOT FIT: {res.refused[name]}, which serve refuses: {res.position_fix}")
            lines += [""] + shown
        typer.echo("\n".join(lines))
    if res.budgets and not any(res.fits(k) for k in res.budgets):
        name, b = next(iter(res.budgets.items()))
        if name in res.refused:
            raise ServeError(f"no serve profile fits: {res.refused[name]} (profile {name})", hint=res.position_fix)
        raise ServeError(f"no serve profile fits in {gpu_mem}{' per GPU' if gpus > 1 else ''}: {first_reason(b)} "
                         f"(profile {name})",
                         hint="plan for a GPU with more memory, or lower the settings each profile names")
