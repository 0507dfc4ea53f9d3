"""Reading recipe and calibration YAML, turning pydantic errors into `path: what — fix` lines, lookup."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from qwenquant import data_path, envs
from qwenquant.errors import RecipeError
from qwenquant.recipe.models import SCHEMA_VERSION, CalibrationSpec, Recipe
from qwenquant.recipe.rules import _calibration_problems, _cross_field_problems

# ---------------------------------------------------------------------------------------------
# Turning pydantic errors into `path: what — fix` lines.


def _model_at(root: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model class that owns the field at `loc` (used to list allowed keys)."""
    import types
    import typing

    cls: Any = root
    for part in loc:
        if isinstance(part, int):
            continue
        if isinstance(cls, type) and issubclass(cls, BaseModel):
            f = cls.model_fields.get(str(part))
            if f is None:
                return None
            cls = f.annotation
        elif typing.get_origin(cls) is dict:
            cls = typing.get_args(cls)[1]
        else:
            return None
        while typing.get_origin(cls) in (typing.Union, getattr(types, "UnionType", None)):
            args = [a for a in typing.get_args(cls) if a is not type(None)]
            cls = args[0] if len(args) == 1 else None
    return cls if isinstance(cls, type) and issubclass(cls, BaseModel) else None


_TYPE_WORDS = {
    "model_type": "a mapping (key: value lines)",
    "model_attributes_type": "a mapping (key: value lines)",
    "dict_type": "a mapping (key: value lines)",
    "list_type": "a list",
    "string_type": "a string",
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
}


def _format_error(err: ErrorDetails, root: type[BaseModel], lines: dict[tuple, int]) -> str:
    loc = tuple(err["loc"])
    path = ".".join(str(x) for x in loc) or "(top level)"
    kind = err["type"]
    if kind == "extra_forbidden":
        parent = _model_at(root, loc[:-1])
        allowed = f" (allowed: {', '.join(sorted(parent.model_fields))})" if parent else ""
        msg = f"unknown key — remove it or fix its spelling{allowed}"
    elif kind == "missing":
        msg = "required key is missing — add it"
    elif kind == "recipe_value":
        msg = err["msg"]
    elif kind in ("literal_error", "enum"):
        msg = f"{err['msg'].replace('Input should be', 'must be')}, got {err.get('input')!r} — use one of those values"
    elif kind in _TYPE_WORDS:
        msg = f"must be {_TYPE_WORDS[kind]}, got {err.get('input')!r} — write {_TYPE_WORDS[kind]}"
    else:
        msg = f"{err['msg'].replace('Input should be', 'must be')}, got {err.get('input')!r} — fix the value"
    line = lines.get(loc) or lines.get(loc[:-1])
    return f"{path}: {msg}" + (f" (line {line})" if line else "")


# ---------------------------------------------------------------------------------------------
# YAML reading: syntax errors with line numbers, duplicate keys refused.


class _UniqueKeyLoader(yaml.SafeLoader):
    pass


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first on line {seen[key]})", key_node.start_mark
            )
        seen[key] = line
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _key_lines(node: Any, prefix: tuple = ()) -> dict[tuple, int]:
    out: dict[tuple, int] = {}
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            loc = prefix + (k.value,)
            out[loc] = k.start_mark.line + 1
            out.update(_key_lines(v, loc))
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            out[prefix + (i,)] = v.start_mark.line + 1
            out.update(_key_lines(v, prefix + (i,)))
    return out


def _read_yaml(path: Path, what: str) -> tuple[dict[str, Any], dict[tuple, int]]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RecipeError(f"{what} file not found: {path}", hint="check the path") from None
    except IsADirectoryError:
        raise RecipeError(
            f"{what} {path} is a folder", hint=f"pass a {what} YAML file or a shipped {what} name"
        ) from None
    except (OSError, UnicodeDecodeError) as e:
        raise RecipeError(f"cannot read {what} {path}: {e}", hint=f"pass a readable {what} YAML file") from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
        lines = _key_lines(yaml.compose(text, Loader=yaml.SafeLoader))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        problem = getattr(e, "problem", None) or str(e)
        raise RecipeError(
            f"{what} {path} is not valid YAML", problems=[f"{where}: {problem} — fix the YAML syntax there"]
        ) from None
    if not isinstance(data, dict):
        raise RecipeError(
            f"{what} {path} is not valid",
            problems=[
                f"(top level): must be a mapping of keys, got {type(data).__name__} — "
                "start from a shipped file (`qwenquant recipe show w4a16-int4head`)"
            ],
        )
    return data, lines


# ---------------------------------------------------------------------------------------------
# Public loaders.


def recipes_dir() -> Path:
    """Shipped recipes: $QWENQUANT_RECIPES_DIR or the package's data/recipes/."""
    return envs.get("QWENQUANT_RECIPES_DIR") or data_path("recipes")


def calibration_dir() -> Path:
    """Shipped calibration definitions: $QWENQUANT_CALIBRATION_DIR or the package's data/calibration/."""
    return envs.get("QWENQUANT_CALIBRATION_DIR") or data_path("calibration")


def list_recipes() -> dict[str, Path]:
    """Shipped recipe names and their files."""
    d = recipes_dir()
    return {p.stem: p for p in sorted(d.glob("*.yaml"))} if d.is_dir() else {}


def list_calibrations() -> dict[str, Path]:
    """Shipped calibration definition names and their files."""
    d = calibration_dir()
    return {p.stem: p for p in sorted(d.glob("*.yaml"))} if d.is_dir() else {}


def _resolve(name_or_path: str | Path, shipped: dict[str, Path], what: str) -> Path:
    s = str(name_or_path)
    p = Path(s).expanduser()
    if isinstance(name_or_path, Path) or p.suffix in (".yaml", ".yml") or "/" in s or os.sep in s or p.is_file():
        return p
    if s in shipped:
        return shipped[s]
    raise RecipeError(
        f"no shipped {what} named {s!r}",
        hint=f"shipped: {', '.join(shipped) or '(none)'}; or pass a path to a YAML file",
    )


def load_recipe(name_or_path: str | Path) -> Recipe:
    """Load and validate a recipe by shipped name (`w4a16-int4head`) or path; RecipeError lists every problem."""
    path = _resolve(name_or_path, list_recipes(), "recipe")
    raw, lines = _read_yaml(path, "recipe")
    return _validate(raw, lines, path)


def calibration_problems(recipe: Recipe) -> list[str]:
    """What of the recipe's calibration set would not resolve where the recipe lies (a relative
    `path` names a file beside the YAML), or what quantize would refuse in its data; empty when none."""
    from qwenquant.recipe.calibdata import check_calibration_data

    spec = recipe.calibration
    if spec.source != "local":
        return []
    where = spec.resolved_path()
    if where is None or not where.is_file():
        return [
            f"calibration.path: {spec.path} resolves to {where.resolve() if where else where}, which does not exist"
        ]
    try:
        check_calibration_data(spec)
    except RecipeError as e:
        return [f"calibration.path: {e.message}"]
    return []


def parse_recipe(raw: dict[str, Any], *, base_dir: Path | None = None) -> Recipe:
    """Validate an already-parsed mapping (tests, programmatic edits); same rules as load_recipe."""
    return _validate(raw, {}, None, base_dir=base_dir)


def _validate(raw: dict[str, Any], lines: dict[tuple, int], path: Path | None, base_dir: Path | None = None) -> Recipe:
    problems: list[str] = []
    recipe: Recipe | None = None
    try:
        recipe = Recipe.model_validate(raw)
    except ValidationError as e:
        problems += [_format_error(err, Recipe, lines) for err in e.errors()]
    for prob in _cross_field_problems(raw):
        if prob not in problems:
            problems.append(_with_line(prob, lines))
    if problems or recipe is None:
        where = path if path is not None else "recipe"
        raise RecipeError(
            f"{where} is invalid ({len(problems)} problem{'s' * (len(problems) != 1)})",
            problems=problems,
            hint="fix each field named above, then `qwenquant recipe validate FILE`",
        )
    base = base_dir or (path.resolve().parent if path is not None else None)
    if base is not None:
        recipe = recipe.model_copy(update={"calibration": recipe.calibration.with_base_dir(base)})
    recipe._source_path = path.resolve() if path is not None else None
    return recipe


def _with_line(problem: str, lines: dict[tuple, int]) -> str:
    path = problem.split(":", 1)[0]
    line = lines.get(tuple(path.split(".")))
    return problem + (f" (line {line})" if line else "")


_CALIBRATION_META = ("schema_version", "name", "description")


def load_calibration_override(name_or_path: str | Path) -> CalibrationSpec:
    """Load a calibration definition (shipped name like `tiny-demo`, or a path to its YAML).

    The file holds CalibrationSpec keys at top level, plus optional schema_version/name/description.
    A relative `path` resolves against the YAML's folder.
    """
    path = _resolve(name_or_path, list_calibrations(), "calibration definition")
    raw, lines = _read_yaml(path, "calibration definition")
    body = {k: v for k, v in raw.items() if k not in _CALIBRATION_META}
    problems: list[str] = []
    if raw.get("schema_version", SCHEMA_VERSION) != SCHEMA_VERSION:
        problems.append(f"schema_version: must be {SCHEMA_VERSION}, got {raw.get('schema_version')!r} — set it to 1")
    spec: CalibrationSpec | None = None
    try:
        spec = CalibrationSpec.model_validate(body)
    except ValidationError as e:
        problems += [_format_error(err, CalibrationSpec, lines) for err in e.errors()]
    problems += [_with_line(x, lines) for x in _calibration_problems(body, "")]
    if problems or spec is None:
        raise RecipeError(
            f"calibration definition {path} is invalid", problems=problems, hint="fix each field named above"
        )
    return spec.with_base_dir(path.resolve().parent)
