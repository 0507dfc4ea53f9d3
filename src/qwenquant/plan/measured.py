"""The plan against what vLLM itself logged: its KV cache on measured server starts, and the plan's residual.

Each point (data/vllm_kv_measured.json) is one start of CUDA vLLM on the 64-layer real-shaped 27B artifact under a
24 GiB budget, with the settings it ran with and vLLM's "Available KV cache memory" line (GiB to two decimals; vLLM
sized the cache from its own profiling run). The plan's figure for the same settings comes from the function serve
and `plan` use (artifact.profile_budget on the shipped reference config and the recipe's estimated weights), so a
change to the memory model moves these residuals, and tests/unit/test_plan_measured.py holds them.

A profile with kv_cache_from_plan has no residual to show: vLLM takes the plan's figure as --kv-cache-memory-bytes,
and its token count then follows the plan's paging exactly (benchmarks/RESULTS.md, long-context run 2).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from typing import Any

from qwenquant import data_path
from qwenquant.plan.budget import GiB

TOLERANCE = 0.02  # what the plan aims for against vLLM's own figure


@dataclass(frozen=True)
class Point:
    label: str
    date: str
    vllm: str
    gpu: str
    report: str
    recipe: str
    profile: str
    gpu_mem_gib: float
    settings: dict[str, Any]
    vllm_kv_gib: float

    @property
    def plan_kv_bytes(self) -> int:
        """The plan's KV cache + GDN state memory for this point's settings."""
        from qwenquant.plan.artifact import profile_budget
        from qwenquant.plan.weights import QuantSettings, model_shape, weights_from_config
        from qwenquant.recipe import load_recipe

        recipe = load_recipe(self.recipe)
        shape = model_shape(json.loads(data_path("qwen3_8-27b.config.json").read_text()))
        weights = weights_from_config(shape, QuantSettings.from_recipe(recipe.canonical()))
        profile = recipe.profile(self.profile).model_copy(update=self.settings)
        total = int(self.gpu_mem_gib * GiB)
        budget = profile_budget(
            shape, weights, profile, "cuda", recipe.artifact.layout, total_bytes=total, include_vision=False
        )
        return budget.cache_available

    @property
    def residual(self) -> float:
        """(plan - vLLM) / vLLM of the KV cache memory, to 0.1%."""
        return round((self.plan_kv_bytes / GiB - self.vllm_kv_gib) / self.vllm_kv_gib, 3) + 0.0

    def line(self) -> str:
        s = self.settings
        within = "within" if abs(self.residual) <= TOLERANCE else "OUTSIDE"
        return (
            f"  against vLLM {self.vllm} ({self.gpu}, {self.date}; utilization {s['gpu_memory_utilization']}, "
            f"{s['max_num_batched_tokens']}-token chunks): KV {self.vllm_kv_gib:.2f} GiB logged, plan "
            f"{self.plan_kv_bytes / GiB:.2f} GiB ({self.residual:+.1%}, {within} {TOLERANCE:.0%})"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "date": self.date,
            "vllm": self.vllm,
            "gpu": self.gpu,
            "report": self.report,
            "settings": self.settings,
            "vllm_kv_bytes": round(self.vllm_kv_gib * GiB),
            "plan_kv_bytes": self.plan_kv_bytes,
            "residual": self.residual,
        }


@cache
def points() -> tuple[Point, ...]:
    doc = json.loads(data_path("vllm_kv_measured.json").read_text())
    return tuple(Point(**p) for p in doc["points"])


def fitted_extra_bytes() -> int:
    """The least-squares PROFILED_EXTRA_BYTES over the points: the pinned constant moved by the mean residual
    (every point's plan figure falls by exactly what the constant rises)."""
    from qwenquant.plan.budget import PROFILED_EXTRA_BYTES

    pts = points()
    return PROFILED_EXTRA_BYTES + round(sum(p.plan_kv_bytes - p.vllm_kv_gib * GiB for p in pts) / len(pts))


def for_profile(name: str) -> list[Point]:
    """The measured points of the profile `name` (any recipe of the family: the settings are the point's own)."""
    return [p for p in points() if p.profile == name]
