"""The layer order of docs/DEVELOPING.md holds: a module of src/qwenquant imports only from its own
layer or lower ones (every import counts: top-level, inside a function, under TYPE_CHECKING)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "qwenquant"

# Lowest first; the first part of a module's name below qwenquant picks its layer (docs/DEVELOPING.md
# says why each sits where it does). "__init__" is the package itself (`from qwenquant import envs`
# of a name that is not a module).
LAYERS: tuple[tuple[str, ...], ...] = (
    (
        "__init__",
        "errors",
        "envs",
        "crash",
        "atomic",
        "hashing",
        "console",
        "procenv",
        "outfolder",
        "net",
        "reportdoc",
        "reportsink",
        "reportpart",
        "depthtext",
    ),
    ("checkpoint",),
    ("recipe",),
    ("manifest", "manifest_form", "signing"),
    ("testbed",),
    ("modeling",),
    ("fetch", "check", "plan", "vllmcompat"),
    ("evaluate", "serve"),
    ("quantize", "bench", "publish"),
    ("demo", "versions", "commands", "cli", "__main__"),
)
LAYER_OF = {part: i for i, parts in enumerate(LAYERS) for part in parts}

# (importing module, imported module) pairs allowed against the order, each with the reason.
# Keep it empty: an entry needs a comment that says why the import cannot go the other way.
KNOWN_EXCEPTIONS: dict[tuple[str, str], str] = {}


def _module_name(path: Path, package: Path = PACKAGE) -> str:
    rel = path.relative_to(package.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _is_module(dotted: str, package: Path) -> bool:
    p = package.parent.joinpath(*dotted.split("."))
    return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()


def _imports(path: Path, root: Path = PACKAGE) -> list[tuple[int, str]]:
    """(line, imported qwenquant module) of every import in the file."""
    name = _module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for a in node.names:
                sub = f"{base}.{a.name}"
                out.append((node.lineno, sub if _is_module(sub, root) else base))
    return [(line, m) for line, m in out if m == "qwenquant" or m.startswith("qwenquant.")]


def _layer(module: str) -> int:
    parts = module.split(".")
    part = parts[1] if len(parts) > 1 else "__init__"
    if part not in LAYER_OF:
        pytest.fail(f"qwenquant.{part} is in no layer: add it to LAYERS here and to docs/DEVELOPING.md")
    return LAYER_OF[part]


def violations(root: Path = PACKAGE) -> list[str]:
    """Every import into a higher layer, as `module:line imports target (layer a is below layer b)`."""
    found = []
    for path in sorted(root.rglob("*.py")):
        name = _module_name(path, root)
        mine = _layer(name)
        for line, target in _imports(path, root):
            theirs = _layer(target)
            if theirs > mine and (name, target) not in KNOWN_EXCEPTIONS:
                found.append(
                    f"{name}:{line} imports {target} ({'/'.join(LAYERS[mine])} is below {'/'.join(LAYERS[theirs])})"
                )
    return found


def test_every_module_imports_only_its_own_layer_or_lower() -> None:
    found = violations()
    assert not found, "imports into a higher layer:\n" + "\n".join(found)


def users_of_the_testbed(root: Path = PACKAGE) -> list[str]:
    """Modules outside testbed/ that import it, besides the demo (which runs it): `module:line imports target`."""
    return [
        f"{name}:{line} imports {target}"
        for path in sorted(root.rglob("*.py"))
        if not (name := _module_name(path, root)).startswith(("qwenquant.testbed", "qwenquant.demo"))
        for line, target in _imports(path, root)
        if target.startswith("qwenquant.testbed")
    ]


def test_nothing_of_the_product_but_the_demo_imports_the_testbed() -> None:
    """The testbed builds tiny checkpoints and serves them for the demo; eval reads the shipped reference's
    files through checkpoint/tinyref.py, never through the testbed."""
    found = users_of_the_testbed()
    assert not found, "the testbed is the demo's:\n" + "\n".join(found)


def test_known_exceptions_are_still_needed() -> None:
    """An exception nobody needs any more is removed, so the list only ever shrinks."""
    seen = {(_module_name(p), t) for p in PACKAGE.rglob("*.py") for _, t in _imports(p)}
    assert not [pair for pair in KNOWN_EXCEPTIONS if pair not in seen]


def write_tree(root: Path, files: dict[str, str]) -> Path:
    """A package tree for a checker's own test: relative path -> text."""
    for f, text in files.items():
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        (root / f).write_text(text)
    return root


def test_the_checker_sees_a_violation(tmp_path: Path) -> None:
    """Relative, lazy and `from package import module` imports upward are found; the same layer and
    lower ones are not (a check that cannot fail is none)."""
    root = write_tree(
        tmp_path / "qwenquant",
        {
            "__init__.py": "def data_path(): ...\n",
            "errors.py": "",
            "recipe/__init__.py": "",
            "recipe/load.py": "from qwenquant import data_path\nfrom qwenquant.errors import QwenquantError\n",
            "checkpoint/__init__.py": "",
            "checkpoint/names.py": "",
            "checkpoint/header.py": "from . import names\n\n\ndef f():\n    from ..recipe import load\n",
            "checkpoint/config.py": "import qwenquant.recipe.load\nfrom qwenquant import recipe\n",
        },
    )
    assert violations(root) == [
        "qwenquant.checkpoint.config:1 imports qwenquant.recipe.load (checkpoint is below recipe)",
        "qwenquant.checkpoint.config:2 imports qwenquant.recipe (checkpoint is below recipe)",
        "qwenquant.checkpoint.header:5 imports qwenquant.recipe.load (checkpoint is below recipe)",
    ]
