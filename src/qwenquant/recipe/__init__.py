"""Recipes: the one place YAML recipes and calibration definitions are parsed and validated.

`load_recipe("w4a16-int4head")` returns a typed, validated `Recipe`; every problem in a file is
collected and raised together as `RecipeError(message, problems=[...])`, each problem phrased
`field.path: what is wrong — how to fix`.

Split by concern: `models` (pydantic models and per-field checks; `serving` the serve section's, `strict`
their base), `rules` (cross-field rules on
the raw mapping), `load` (YAML reading, error lines, shipped-file lookup), `targets` (target
matching shared with `check`). Import from `qwenquant.recipe`.
"""

from __future__ import annotations

from qwenquant.recipe.load import (
    calibration_dir,
    list_calibrations,
    list_recipes,
    load_calibration_override,
    load_recipe,
    parse_recipe,
    recipes_dir,
)
from qwenquant.recipe.models import (
    SCHEMA_VERSION,
    ArtifactSpec,
    CalibrationSpec,
    EvalSpec,
    LmHeadSpec,
    ModelSpec,
    MtpSpec,
    QuantizationSpec,
    Recipe,
)
from qwenquant.recipe.rules import REQUIRED_PROFILES
from qwenquant.recipe.serving import ResolvedProfile, ServeProfile, ServeSettings, ServeSpec, SpeculativeSpec
from qwenquant.recipe.targets import LM_HEAD_TARGET, target_matches, targets_cover

__all__ = [
    "LM_HEAD_TARGET",
    "REQUIRED_PROFILES",
    "SCHEMA_VERSION",
    "ArtifactSpec",
    "CalibrationSpec",
    "EvalSpec",
    "LmHeadSpec",
    "ModelSpec",
    "MtpSpec",
    "QuantizationSpec",
    "Recipe",
    "ResolvedProfile",
    "ServeProfile",
    "ServeSettings",
    "ServeSpec",
    "SpeculativeSpec",
    "calibration_dir",
    "list_calibrations",
    "list_recipes",
    "load_calibration_override",
    "load_recipe",
    "parse_recipe",
    "recipes_dir",
    "target_matches",
    "targets_cover",
]
