"""`qwenquant recipe validate|show|list`: check and inspect recipes (no torch import)."""

from __future__ import annotations

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
    from qwenquant.recipe import load_recipe

    r = load_recipe(file)  # RecipeError (exit 2) lists every problem
    if as_json:
        print_json({"ok": True, "name": r.name, "sha256": r.sha256(), "features": r.features()})
        return
    stdout.print(f"OK {r.name} sha256:{r.sha256()}", markup=False)


@recipe_app.command("show")
def show(
    name: str = typer.Argument(..., help="Shipped recipe name or YAML path."),
    as_json: bool = typer.Option(False, "--json", help="Canonical JSON instead of YAML."),
) -> None:
    """Print the canonical recipe (every default filled in) and its sha256.

    Examples:

      qwenquant recipe show w4a16-int4head

      qwenquant recipe show w4a16-int4head --json | jq .recipe.quantization
    """
    import yaml

    from qwenquant.console import print_json, stdout
    from qwenquant.recipe import load_recipe

    r = load_recipe(name)
    if as_json:
        print_json({"sha256": r.sha256(), "recipe": r.canonical()})
        return
    print(f"# sha256: {r.sha256()}")
    stdout.print(yaml.safe_dump(r.canonical(), sort_keys=False, allow_unicode=True), markup=False, end="")


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

    recipes = []
    for name, path in list_recipes().items():
        try:
            r = load_recipe(path)
            recipes.append({"name": name, "path": str(path), "valid": True, "features": r.features(),
                            "sha256": r.sha256()})
        except RecipeError:
            recipes.append({"name": name, "path": str(path), "valid": False, "features": [], "sha256": None})
    calibrations = [{"name": name, "path": str(path)} for name, path in list_calibrations().items()]
    if as_json:
        print_json({"recipes": recipes, "calibrations": calibrations})
        return
    for r in recipes:
        desc = "recipe: " + ", ".join(r["features"]) if r["valid"] else \
            "recipe (invalid: run `qwenquant recipe validate` on it)"
        stdout.print(f"{r['name']:34} {desc}", markup=False, soft_wrap=True)
    for c in calibrations:
        stdout.print(f"{c['name']:34} calibration set (--calibration {c['name']})", markup=False)
