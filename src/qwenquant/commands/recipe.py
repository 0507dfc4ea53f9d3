"""`qwenquant recipe validate|show|list`: check and inspect recipes (no torch import)."""

from __future__ import annotations

from typing import Any

import typer

from qwenquant.commands._app import app

recipe_app = typer.Typer(
    help=(
        "Validate, show and list quantization recipes.\n\n"
        "Examples:\n\n"
        "  qwenquant recipe list\n\n"
        "  qwenquant recipe show w4a16-int4head --json\n\n"
        "  qwenquant recipe validate my-recipe.yaml"
    ),
    no_args_is_help=True,
)
app.add_typer(recipe_app, name="recipe")


@recipe_app.command("validate")
def validate(
    file: str = typer.Argument(..., help="Recipe YAML path or shipped name."),
    as_json: bool = typer.Option(False, "--json", help="Print {name, sha256, features} as JSON on stdout."),
) -> None:
    """Print OK, or every problem with its field path and fix (exit 2).

    Examples:

      qwenquant recipe validate my-recipe.yaml

      qwenquant recipe validate my-recipe.yaml --json
    """
    from qwenquant.console import print_json, stdout
    from qwenquant.errors import RecipeError
    from qwenquant.recipe import load_recipe
    from qwenquant.recipe.load import calibration_problems

    r = load_recipe(file)  # RecipeError (exit 2) lists every problem
    unresolved = calibration_problems(r) + _eval_text_problems(r)
    if unresolved:  # what quantize would refuse before its first stage
        raise RecipeError(
            f"recipe {r.source_path or file} is invalid: " + "; ".join(unresolved),
            hint="a relative path resolves against the recipe's folder: write it relative to the "
            "recipe's folder or absolute (`qwenquant recipe show NAME` writes it absolute)",
        )
    if as_json:
        print_json({"ok": True, "name": r.name, "sha256": r.sha256(), "features": r.features()})
        return
    stdout.print(f"OK {r.name} sha256:{r.sha256()}", markup=False)


def _eval_text_problems(r: object) -> list[str]:
    """The quick eval's `text` when it names a set or a YAML that cannot be loaded ("auto" and the tiny
    reference's held-out text always can)."""
    from qwenquant.errors import UsageError
    from qwenquant.evaluate.textset import load_text_set

    spec = getattr(r, "eval", None)
    if spec is None or spec.text in ("auto", "tiny-reference"):
        return []
    try:
        load_text_set(spec.text)
    except UsageError as e:
        return [f"eval.text: {e.message}"]
    return []


@recipe_app.command("show")
def show(
    name: str = typer.Argument(..., help="Shipped recipe name or YAML path."),
    as_json: bool = typer.Option(False, "--json", help="Canonical JSON instead of YAML."),
) -> None:
    """Print the recipe with every default filled in and its sha256; a relative calibration path is
    written absolute, so the text saved in any folder is the same recipe (`--json`: the canonical form).

    Examples:

      qwenquant recipe show w4a16-int4head

      qwenquant recipe show w4a16-int4head --json | jq .recipe.quantization
    """
    import yaml

    from qwenquant.console import print_json, stdout
    from qwenquant.recipe import load_recipe, parse_recipe

    r = load_recipe(name)
    if as_json:
        print_json({"sha256": r.sha256(), "recipe": r.canonical()})
        return
    doc = _portable(r)
    saved = parse_recipe(doc)  # what `--recipe` of this text saved anywhere loads
    if saved.sha256() != r.sha256():
        print(
            f"# sha256 of {name} as it is: {r.sha256()}; its calibration.path ({r.calibration.path}) is relative "
            "to its folder and is written absolute below, so that a copy reads the same file"
        )
    print(f"# sha256: {saved.sha256()}")
    stdout.print(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True), markup=False, end="")


def _portable(r: object) -> dict:
    """The canonical recipe with every default shown (`activations: bf16` too, which the canonical form
    leaves out) and a relative local calibration path made absolute: the text works from any folder."""
    doc = r.canonical()  # type: ignore[attr-defined]
    for profile in doc["serve"]["profiles"].values():
        profile.setdefault("activations", "bf16")
    calibration = r.calibration  # type: ignore[attr-defined]
    where = calibration.resolved_path() if calibration.source == "local" else None
    if where is not None and str(where) != calibration.path:
        doc["calibration"]["path"] = str(where.resolve())
    return doc


@recipe_app.command("list")
def list_(as_json: bool = typer.Option(False, "--json", help="Print the list as JSON on stdout.")) -> None:
    """List shipped recipes (what tells each from the others: layout, MTP head, lm_head, calibration,
    quick eval, vLLM releases) and calibration definitions.

    Examples:

      qwenquant recipe list

      qwenquant recipe list --json | jq '.recipes[] | select(.valid) | .name'
    """
    from qwenquant.console import print_json, stdout
    from qwenquant.errors import RecipeError
    from qwenquant.recipe import list_calibrations, list_recipes, load_recipe

    recipes: list[dict[str, Any]] = []
    for name, path in list_recipes().items():
        try:
            r = load_recipe(path)
            recipes.append(
                {"name": name, "path": str(path), "valid": True, "features": r.features(), "sha256": r.sha256()}
            )
        except RecipeError:
            recipes.append({"name": name, "path": str(path), "valid": False, "features": [], "sha256": None})
    calibrations = [{"name": name, "path": str(path)} for name, path in list_calibrations().items()]
    if as_json:
        print_json({"recipes": recipes, "calibrations": calibrations})
        return
    for row in recipes:
        desc = (
            "recipe: " + ", ".join(row["features"])
            if row["valid"]
            else "recipe (invalid: run `qwenquant recipe validate` on it)"
        )
        stdout.print(f"{row['name']:34} {desc}", markup=False, soft_wrap=True)
    for c in calibrations:
        stdout.print(f"{c['name']:34} calibration set (--calibration {c['name']})", markup=False)
