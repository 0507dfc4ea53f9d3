"""Every `--help` shows the text its source wrote: the CLI renders help with rich markup, where an
unescaped `[word]` is taken for a style tag and vanishes (`pip install 'qwenquant[sign]'` printed as
`pip install 'qwenquant'`). Walks every command and subcommand; a bracketed part of a docstring or an
option's help must appear as it is in the rendered help (write `\\[` in the source to keep it)."""

from __future__ import annotations

import re

import pytest
import typer.main
from typer.testing import CliRunner

from qwenquant.cli import app

BRACKETED = re.compile(r"\\?\[([^\[\]\n]+)\]")


def _walk(cmd: object, path: list[str]) -> list[tuple[list[str], object]]:
    out = [(path, cmd)]
    for name, sub in sorted(getattr(cmd, "commands", {}).items()):
        out += _walk(sub, [*path, name])
    return out


COMMANDS = _walk(typer.main.get_command(app), [])


def _written(cmd: object) -> list[str]:
    """`[...]` parts of the command's docstring and option help, as a reader should see them."""
    texts = [getattr(cmd, "help", None) or ""] + [getattr(p, "help", None) or "" for p in getattr(cmd, "params", [])]
    return [f"[{m.group(1)}]" for t in texts for m in BRACKETED.finditer(t)]


def _rendered(path: list[str]) -> str:
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "200", "TERMINAL_WIDTH": "200"})
    assert result.exit_code == 0, result.output
    return " ".join(result.output.replace("│", " ").split())


def test_the_walk_sees_every_command_and_a_bracketed_help() -> None:
    """The walk reaches subcommands, and the parts it checks exist (serve's signing extra)."""
    names = {" ".join(p) for p, _ in COMMANDS}
    assert {"serve", "publish", "recipe list"} <= names
    serve = dict((" ".join(p), c) for p, c in COMMANDS)["serve"]
    assert "[sign]" in _written(serve)


@pytest.mark.parametrize("path, cmd", COMMANDS, ids=[" ".join(p) or "qwenquant" for p, _ in COMMANDS])
def test_help_keeps_every_bracketed_part(path: list[str], cmd: object) -> None:
    shown = _rendered(path)
    lost = [part for part in _written(cmd) if " ".join(part.split()) not in shown]
    assert not lost, f"`qwenquant {' '.join(path)} --help` dropped {lost} (rich markup: escape as \\[ in the source)"


def test_each_eval_subcommand_says_where_its_own_report_goes() -> None:
    """eval offline has no URL: its --report default is beside the artifact, nothing more."""
    offline, served = _rendered(["eval", "offline"]), _rendered(["eval", "served"])
    assert "default: beside the artifact)" in offline and "URL: nowhere" not in offline
    assert "with a URL: nowhere" in served
