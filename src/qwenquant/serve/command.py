"""`qwenquant plan`: the memory budget of every serve profile, from an artifact or a bare config.json."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from qwenquant.errors import ServeError
from qwenquant.recipe import load_recipe
from qwenquant.serve import argv as argvmod
from qwenquant.plan import budget as budgetmod
from qwenquant.serve.preflight import cache_settings, recipe_from_manifest
from qwenquant.plan.weights import (ModelShape, QuantSettings, WeightBreakdown, artifact_tensor_bytes,
                                     model_shape, tp_shape, weights_from_config, weights_from_tensors)

_UNITS = {"": 1, "b": 1, "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
          "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4}


def parse_size(text: str) -> int:
    """'24GiB' / '24GB' / '24' (GiB) -> bytes."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise ServeError(f"cannot read the size {text!r}", hint="write it like 24GiB, 24GB or 24 (GiB)")
    unit = m.group(2).lower() or "gib"
    return int(float(m.group(1)) * _UNITS[unit])


@dataclass
class PlanResult:
    shape: ModelShape
    weights: WeightBreakdown
    include_vision: bool
    budgets: dict[str, budgetmod.Budget]
    source: str


def make_plan(target: Path, gpu_bytes: int, *, recipe_name: Optional[str] = None,
              profiles: Optional[list[str]] = None, device: str = "cuda", tp: int = 1) -> PlanResult:
    """Budgets for each profile; `target` is an artifact folder, a config.json, or a folder with one.
    With `tp` > 1 (vLLM tensor parallelism over `tp` GPUs of `gpu_bytes` each) every figure is per GPU."""
    target = Path(target)
    manifest = None
    if target.is_dir() and (target / "qwenquant-manifest.json").exists() and recipe_name is None:
        from qwenquant.manifest import load_manifest

        manifest = load_manifest(target)
        recipe = recipe_from_manifest(manifest)
        config = json.loads((target / "config.json").read_text())
        tensors = artifact_tensor_bytes(target, [f.path for f in manifest.files])
        weights = weights_from_tensors(tensors, tp_shape(config, tp), tp)
        source = f"artifact {target}"
    else:
        cfg_path = target / "config.json" if target.is_dir() else target
        try:
            config = json.loads(cfg_path.read_text())
        except (OSError, ValueError) as e:
            raise ServeError(f"cannot read {cfg_path}: {e}", hint="pass an artifact folder or a config.json") from None
        recipe = load_recipe(recipe_name or "w4a16-int4head")
        weights = weights_from_config(tp_shape(config, tp), QuantSettings.from_recipe(recipe.canonical()), tp=tp)
        source = f"config {cfg_path} + recipe {recipe.name}"
    shape = model_shape(config)
    layout = argvmod.artifact_layout(manifest) if manifest else recipe.artifact.layout
    names = profiles or sorted(recipe.serve.profiles)
    budgets = {}
    include_vision = False
    for name in names:
        prof = recipe.profile(name)
        d = argvmod.decide(prof, device, layout)
        include_vision = manifest is not None and not d.language_model_only
        budgets[name] = budgetmod.make_budget(
            shape, weights, cache_settings(prof, device, layout), device=device, total_bytes=gpu_bytes,
            utilization=prof.gpu_memory_utilization, max_model_len=prof.max_model_len,
            max_num_seqs=prof.max_num_seqs, max_num_batched_tokens=d.max_num_batched_tokens,
            enforce_eager=d.enforce_eager, include_vision=include_vision, tp=tp)
    return PlanResult(shape, weights, include_vision, budgets, source)
