"""`qwenquant plan` (light imports; the work is in qwenquant.plan)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import typer

from qwenquant.commands._app import Split, app


@app.command()
def plan(
    target: Path = typer.Argument(
        ..., exists=True, help="Artifact folder, or a config.json (or a folder holding one)."
    ),
    gpu_mem: str = typer.Option("24GiB", "--gpu-mem", help="GPU memory to plan for, e.g. 24GiB."),
    recipe: str | None = typer.Option(None, help="Recipe for a bare config (default w4a16-int4head)."),
    profile: list[str] = typer.Option(
        [], "--profile", "-p", metavar="PROFILE", help="Only this profile; repeat for several (default: all)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    gpus: int = typer.Option(1, "--gpus", min=1, help="GPUs to split the model over; figures are per GPU."),
    split: Split | None = typer.Option(
        None,
        "--split",
        help="With --gpus N: tensor (every layer split over the "
        "GPUs) or pipeline (each GPU holds a run of whole layers: one budget per "
        "stage). Default: as `serve --gpus N` decides: tensor for a profile that "
        "drafts with MTP, else from the GPUs' link (nvidia-smi topo), tensor when it "
        "cannot be read.",
        show_default=False,
    ),
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
    from qwenquant.errors import UsageError

    if split is not None and gpus == 1:
        raise UsageError(
            f"--split needs --gpus N (--split {split.value} splits the model over several GPUs)",
            hint=f"e.g. --gpus 2 --split {split.value}",
        )
    groups = _layout_groups(target, recipe, profile, gpus, split.value if split else None)
    results = [(layout, _plan_one(target, gpu_mem, recipe, names, gpus, layout, as_json)) for layout, names in groups]
    if as_json:
        from qwenquant.console import print_json

        print_json(_merge_json(results))
    _refuse_if_none_fits(results, gpu_mem, gpus)


def _layout_groups(
    target: Path, recipe: str | None, profiles: list[str], gpus: int, split: str | None
) -> list[tuple[Any, list[str]]]:
    """The profiles grouped by the layout `serve --gpus N` would give each (serve/topology.py decide_layout):
    --split, else tensor for MTP profiles where the link would pick pipeline, else the GPUs' link."""
    from qwenquant.plan.artifact import plan_recipe
    from qwenquant.serve.topology import decide_layout, link_needed, read_topology

    rec = plan_recipe(target, recipe)
    names = profiles or sorted(rec.serve.profiles)
    links, p2p = read_topology() if link_needed(gpus, split, "cuda", False) else ({}, {})
    link = ([str(i) for i in range(gpus)], links, p2p) if links else None
    groups: dict[Any, list[str]] = {}
    for name in names:
        prof = rec.profile(name)
        mtp = bool(prof.speculative and prof.speculative.num_speculative_tokens)
        groups.setdefault(decide_layout(gpus, split, "cuda", None, None, mtp, link), []).append(name)
    return list(groups.items())


def _plan_one(
    target: Path, gpu_mem: str, recipe: str | None, names: list[str], gpus: int, layout: Any, as_json: bool
) -> Any:
    from qwenquant.plan.artifact import make_plan
    from qwenquant.plan.gpumem import parse_size
    from qwenquant.plan.pipeline import PARTITION_ENV

    res = make_plan(
        target,
        parse_size(gpu_mem),
        recipe_name=recipe,
        profiles=names,
        tp=layout.tp,
        pp=layout.pp,
        partition=os.environ.get(PARTITION_ENV),
    )
    if not as_json:
        typer.echo("\n".join(_text(res, gpu_mem, gpus, layout)))
    return res


def _text(res: Any, gpu_mem: str, gpus: int, layout: Any) -> list[str]:
    from qwenquant.plan.report import budget_lines, pipeline_lines, weights_lines

    where = (
        f"GPU memory {gpu_mem}"
        if gpus == 1
        else f"{gpus} GPUs of {gpu_mem} each under {layout.kind} parallelism ({layout.reason}), figures per GPU"
    )
    lines = [f"plan for {res.source}, {where}"] + weights_lines(res.weights, res.include_vision)
    for k, w in enumerate(res.stage_weights):
        lines += [""] + [
            f"pipeline stage {k}: {line}" if i == 0 else line
            for i, line in enumerate(weights_lines(w, res.include_vision))
        ]
    for name, b in res.budgets.items():
        for i, x in enumerate(res.stages.get(name, [b])):
            shown = budget_lines(name, x, res.shape, refused=res.refused.get(name), positions=res.max_positions)
            if i == 0 and name in res.refused:  # before the memory figures, which hold whatever the refusal
                shown.insert(1, f"  DOES NOT FIT: {res.refused[name]}, which serve refuses: {res.fix(name)}")
            lines += [""] + shown
        if layout.tp * layout.pp == 1:
            lines += _measured_lines(name, res.budgets[name])
        if layout.pp > 1:
            lines += [""] + pipeline_lines(name, res.stages[name], res.shape, refused=res.refused.get(name))
    return lines


def _measured_lines(name: str, b: Any) -> list[str]:
    """The plan's residual against vLLM's own KV figure on the measured starts of this profile (one GPU)."""
    from qwenquant.plan.measured import for_profile

    if b.device != "cuda":
        return []
    if not b.profiled:
        return ["  KV cache from the plan: serve passes this figure as --kv-cache-memory-bytes (vLLM does not profile)"]
    return [p.line() for p in for_profile(name)]


def _measured_json(name: str, b: Any) -> list[dict[str, Any]]:
    from qwenquant.plan.measured import for_profile

    return [p.to_json() for p in for_profile(name)] if b.device == "cuda" and b.profiled else []


def _merge_json(results: list[tuple[Any, Any]]) -> dict[str, Any]:
    """One document for every layout group: the sizes at the top when every profile shares them."""
    from qwenquant.plan.report import budget_dict

    first_layout, first = results[0]
    same = len(results) == 1
    doc: dict[str, Any] = {
        "source": first.source,
        "tensor_parallel_size": first_layout.tp if same else None,
        "pipeline_parallel_size": first_layout.pp if same else None,
        "weights": first.weights.bytes,
        "max_position_embeddings": first.max_positions,
        "stage_weights": [w.bytes for w in first.stage_weights] or None,
        "profiles": {},
    }
    for layout, res in results:
        for k, b in res.budgets.items():
            doc["profiles"][k] = (
                budget_dict(b, res.shape)
                | {"fits": res.fits(k), "position_problem": res.refused.get(k)}
                | {"layout": {"tensor": layout.tp, "pipeline": layout.pp, "reason": layout.reason}}
                | ({"stages": [budget_dict(x, res.shape) for x in res.stages[k]]} if layout.pp > 1 else {})
                | {"measured": _measured_json(k, b) if layout.tp * layout.pp == 1 else []}
            )
    return doc


def _refuse_if_none_fits(results: list[tuple[Any, Any]], gpu_mem: str, gpus: int) -> None:
    """Exit 7 when no profile fits, naming the first reason."""
    from qwenquant.errors import ServeError
    from qwenquant.plan.report import first_reason, stage_name

    if not any(res.fits(k) for _, res in results for k in res.budgets) and any(res.budgets for _, res in results):
        layout, res = next(x for x in results if x[1].budgets)
        name, b = next(iter(res.budgets.items()))
        if name in res.refused:
            raise ServeError(f"no serve profile fits: {res.refused[name]} (profile {name})", hint=res.fix(name))
        where = f" ({stage_name(b)})" if layout.pp > 1 else ""
        raise ServeError(
            f"no serve profile fits in {gpu_mem}{' per GPU' if gpus > 1 else ''}: {first_reason(b)} "
            f"(profile {name}{where})",
            hint="plan for a GPU with more memory, or lower the settings each profile names",
        )
