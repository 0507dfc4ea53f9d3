"""The memory plan of an artifact, or of a bare config.json with a recipe: one budget per serve
profile (`qwenquant plan`, and serve's preflight for the profile it starts). Reads config.json and
safetensors headers; starts nothing and asks no GPU (the caller gives the memory to plan for).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qwenquant.errors import ServeError, UsageError
from qwenquant.manifest import MANIFEST_NAME, Manifest, load_manifest
from qwenquant.plan import pipeline
from qwenquant.plan.budget import Budget, make_budget
from qwenquant.plan.positions import long_allowed, position_fix, position_limit, position_problem
from qwenquant.plan.settings import artifact_layout, cache_settings, decide, recipe_from_manifest
from qwenquant.plan.weights import (
    ModelShape,
    QuantSettings,
    WeightBreakdown,
    artifact_tensor_bytes,
    model_shape,
    tp_shape,
    weights_from_config,
    weights_from_tensors,
)
from qwenquant.recipe import Recipe, ResolvedProfile, load_recipe


@dataclass
class PlanResult:
    shape: ModelShape
    weights: WeightBreakdown
    include_vision: bool
    budgets: dict[str, Budget]  # under pipeline parallelism: the stage that limits each profile
    source: str
    stages: dict[str, list[Budget]] = field(default_factory=dict)  # pipeline parallelism: one per stage
    stage_weights: list[WeightBreakdown] = field(default_factory=list)
    # profile -> why serve refuses it whatever the memory (max-model-len above max_position_embeddings)
    refused: dict[str, str] = field(default_factory=dict)
    position_fix: str = ""
    fixes: dict[str, str] = field(default_factory=dict)  # profile -> what to do, where not position_fix
    max_positions: int | None = None  # the model's max_position_embeddings (serve refuses a longer max-model-len)

    def fits(self, name: str) -> bool:
        """The profile's budget fits and serve would not refuse it."""
        return self.budgets[name].fits and name not in self.refused

    def fix(self, name: str) -> str:
        """What to do about a refused profile."""
        return self.fixes.get(name, self.position_fix)


def profile_budget(
    shape: ModelShape,
    weights: WeightBreakdown,
    profile: ResolvedProfile,
    device: str,
    layout: str,
    *,
    total_bytes: int,
    include_vision: bool,
    tp: int = 1,
) -> Budget:
    """One profile's budget on `total_bytes` (GPU memory per GPU, or the CPU KV cache space)."""
    d = decide(profile, device, layout)
    return make_budget(
        shape,
        weights,
        cache_settings(profile, device, layout),
        device=device,
        total_bytes=total_bytes,
        utilization=profile.gpu_memory_utilization,
        max_model_len=profile.max_model_len,
        max_num_seqs=profile.max_num_seqs,
        max_num_batched_tokens=d.max_num_batched_tokens,
        enforce_eager=d.enforce_eager,
        include_vision=include_vision,
        tp=tp,
        host_embeddings=profile.host_embeddings and device == "cuda",
        kv_cache_from_plan=profile.kv_cache_from_plan,
    )


def profile_stages(
    shape: ModelShape,
    weights: list[WeightBreakdown],
    profile: ResolvedProfile,
    device: str,
    layout: str,
    ranges: list[tuple[int, int]],
    *,
    total_bytes: int,
    include_vision: bool,
) -> list[Budget]:
    """One profile's budget on each pipeline stage's GPU (plan.pipeline)."""
    d = decide(profile, device, layout)
    return pipeline.stage_budgets(
        shape,
        weights,
        cache_settings(profile, device, layout),
        ranges,
        device=device,
        total_bytes=total_bytes,
        utilization=profile.gpu_memory_utilization,
        max_model_len=profile.max_model_len,
        max_num_seqs=profile.max_num_seqs,
        max_num_batched_tokens=d.max_num_batched_tokens,
        enforce_eager=d.enforce_eager,
        include_vision=include_vision,
    )


def artifact_budget(
    artifact: Path,
    manifest: Any,
    profile: ResolvedProfile,
    device: str,
    *,
    total_bytes: int,
    tp: int = 1,
    pp: int = 1,
    partition: str | None = None,
) -> Budget:
    """The memory plan for an artifact on a device with `total_bytes` (GPU memory or CPU KV space),
    per GPU under tensor parallelism of size `tp`; under pipeline parallelism of size `pp`, the
    stage that limits (`partition`: a VLLM_PP_LAYER_PARTITION value)."""
    config = json.loads((artifact / "config.json").read_text())
    files = [f.path for f in getattr(manifest, "files", ())] or None
    shape = model_shape(config)
    layout = artifact_layout(manifest)
    vision = not decide(profile, device, layout).language_model_only
    if pp > 1:
        ranges = pipeline.stage_ranges(len(shape.layer_types), pp, partition)
        stage_weights = pipeline.stage_weights_from_tensors(artifact_tensor_bytes(artifact, files), ranges)
        return pipeline.binding(
            profile_stages(
                shape, stage_weights, profile, device, layout, ranges, total_bytes=total_bytes, include_vision=vision
            )
        )
    weights = weights_from_tensors(artifact_tensor_bytes(artifact, files), shape, tp)
    return profile_budget(
        shape, weights, profile, device, layout, total_bytes=total_bytes, include_vision=vision, tp=tp
    )


def plan_recipe(target: Path, recipe_name: str | None = None) -> Recipe:
    """The recipe `make_plan` plans with: the artifact's (its manifest's), else `recipe_name` (w4a16-int4head)."""
    target = Path(target)
    if target.is_dir() and (target / MANIFEST_NAME).exists() and recipe_name is None:
        return recipe_from_manifest(load_manifest(target))
    return load_recipe(recipe_name or "w4a16-int4head")


def read_model_config(target: Path, cfg_path: Path) -> dict[str, Any]:
    """The config a bare `plan TARGET` reads: a Qwen3.5 config.json, or a UsageError naming the file
    (a folder without one, a file that is not JSON, JSON that is not such a config)."""
    hint = "pass an artifact folder or a Qwen3.5 config.json (or a folder holding one)"
    if target.is_dir() and not cfg_path.exists():
        empty = not any(target.glob("*.safetensors"))
        raise UsageError(
            f"{target} holds no config.json" + (" and no safetensors file: it is not an artifact" if empty else ""),
            hint=hint,
        )
    try:
        config = json.loads(cfg_path.read_bytes())
    except OSError as e:
        raise UsageError(f"cannot read {cfg_path}: {e.strerror}", hint=hint) from None
    except ValueError as e:
        raise UsageError(f"{cfg_path} is not JSON ({e})", hint=hint) from None
    if not isinstance(config, dict):
        raise UsageError(f"{cfg_path} is not a Qwen3.5 model config (not a JSON object)", hint=hint)
    try:
        model_shape(config)
    except ServeError as e:
        detail = e.message.removeprefix("config.json ").split(": not a Qwen", 1)[0]
        detail = detail.removeprefix("is not a Qwen3.5 model config ").strip("()")
        raise UsageError(f"{cfg_path} is not a Qwen3.5 model config ({detail})", hint=hint) from None
    return config


@dataclass(frozen=True)
class _PlanInputs:
    """What a plan is made from: the recipe, the model's config and the weights (per pipeline stage with pp > 1)."""

    manifest: Manifest | None
    recipe: Recipe
    config: dict[str, Any]
    weights: WeightBreakdown
    stage_weights: list[WeightBreakdown]
    ranges: list[tuple[int, int]]
    source: str


def _plan_inputs(target: Path, recipe_name: str | None, tp: int, pp: int, partition: str | None) -> _PlanInputs:
    """An artifact's own recipe and tensor bytes, or a config.json with a named recipe's estimated weights."""
    manifest = None
    stage_weights: list[WeightBreakdown] = []
    ranges: list[tuple[int, int]] = []
    if target.is_dir() and (target / MANIFEST_NAME).exists() and recipe_name is None:
        manifest = load_manifest(target)
        recipe = recipe_from_manifest(manifest)
        config = json.loads((target / "config.json").read_text())
        tensors = artifact_tensor_bytes(target, [f.path for f in manifest.files])
        weights = weights_from_tensors(tensors, tp_shape(config, tp), tp)
        if pp > 1:
            ranges = pipeline.stage_ranges(len(tp_shape(config, 1, pp).layer_types), pp, partition)
            stage_weights = pipeline.stage_weights_from_tensors(tensors, ranges)
        return _PlanInputs(manifest, recipe, config, weights, stage_weights, ranges, f"artifact {target}")
    cfg_path = target / "config.json" if target.is_dir() else target
    config = read_model_config(target, cfg_path)
    recipe = load_recipe(recipe_name or "w4a16-int4head")
    quant = QuantSettings.from_recipe(recipe.canonical())
    weights = weights_from_config(tp_shape(config, tp), quant, tp=tp)
    if pp > 1:
        shape = tp_shape(config, 1, pp)
        ranges = pipeline.stage_ranges(len(shape.layer_types), pp, partition)
        stage_weights = pipeline.stage_weights_from_config(shape, quant, ranges)
    return _PlanInputs(
        None, recipe, config, weights, stage_weights, ranges, f"config {cfg_path} + recipe {recipe.name}"
    )


def _refusals(
    inputs: _PlanInputs, budgets: dict[str, Budget], device: str, tp: int, pp: int
) -> tuple[dict[str, str], dict[str, str]]:
    """({profile: why serve refuses it}, {profile: the fix}): positions past the model's, MTP over a pipeline
    split, the embedding table in host memory over several GPUs."""
    recipe, config = inputs.recipe, inputs.config
    refused = {
        name: p
        for name, b in budgets.items()
        if (p := position_problem(config, b.max_model_len, os.environ)) is not None
    }
    drafting = {name for name in budgets if pp > 1 and _drafts(recipe.profile(name))}
    refused |= {name: f"profile {name} drafts with MTP: {pipeline.MTP_PIPELINE}" for name in drafting}
    host = {name for name in budgets if tp * pp > 1 and device == "cuda" and recipe.profile(name).host_embeddings}
    refused |= {
        name: f"profile {name} keeps the embedding table in host memory, which serve does on one GPU only"
        for name in host
    }
    fixes = dict.fromkeys(drafting, pipeline.MTP_PIPELINE_FIX) | dict.fromkeys(
        host, "serve it on one GPU, or with --no-host-embeddings and a max-model-len the plan without them fits"
    )
    return refused, fixes


def make_plan(
    target: Path,
    gpu_bytes: int,
    *,
    recipe_name: str | None = None,
    profiles: list[str] | None = None,
    device: str = "cuda",
    tp: int = 1,
    pp: int = 1,
    partition: str | None = None,
) -> PlanResult:
    """Budgets for each profile; `target` is an artifact folder, a config.json, or a folder with one.
    With `tp` > 1 (vLLM tensor parallelism over `tp` GPUs of `gpu_bytes` each) every figure is per GPU;
    with `pp` > 1 (pipeline parallelism over `pp` GPUs) each stage's GPU has its own budget
    (`stages`; `partition`: a VLLM_PP_LAYER_PARTITION value)."""
    inputs = _plan_inputs(Path(target), recipe_name, tp, pp, partition)
    recipe, config, manifest = inputs.recipe, inputs.config, inputs.manifest
    shape = model_shape(config)
    layout = artifact_layout(manifest) if manifest else recipe.artifact.layout
    budgets = {}
    stages: dict[str, list[Budget]] = {}
    include_vision = False
    for name in profiles or sorted(recipe.serve.profiles):
        prof = recipe.profile(name)
        include_vision = manifest is not None and not decide(prof, device, layout).language_model_only
        if pp > 1:
            ranges = inputs.ranges
            stages[name] = profile_stages(
                shape,
                inputs.stage_weights,
                prof,
                device,
                layout,
                ranges,
                total_bytes=gpu_bytes,
                include_vision=include_vision,
            )
            budgets[name] = pipeline.binding(stages[name])
        else:
            budgets[name] = profile_budget(
                shape, inputs.weights, prof, device, layout, total_bytes=gpu_bytes, include_vision=include_vision, tp=tp
            )
    refused, fixes = _refusals(inputs, budgets, device, tp, pp)
    return PlanResult(
        shape,
        inputs.weights,
        include_vision,
        budgets,
        inputs.source,
        stages=stages,
        stage_weights=inputs.stage_weights,
        refused=refused,
        position_fix=position_fix(config),
        fixes=fixes,
        max_positions=None if long_allowed(os.environ) else position_limit(config),
    )


def _drafts(profile: ResolvedProfile) -> bool:
    return bool(profile.speculative and profile.speculative.num_speculative_tokens)
