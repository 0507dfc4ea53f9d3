"""`qwenquant eval` as subcommands: `eval --help` lists offline, served and gates with examples, each
subcommand's help has its own, and the shipped gates are listed by `eval gates`."""

from __future__ import annotations

import json

import pytest

from helpers import flat, qq


def test_eval_help_lists_the_subcommands_with_examples() -> None:
    proc = qq("eval", "--help")
    assert proc.returncode == 0, proc.stderr
    out = flat(proc.stdout)
    for sub in ("offline", "served", "gates"):
        assert f"qwenquant eval {sub}" in out, out  # an example of each
        assert f"│ {sub} " in proc.stdout, proc.stdout  # and the command in the list
    assert "Examples:" in out


@pytest.mark.parametrize("sub", ["offline", "served", "gates"])
def test_each_subcommand_help_has_examples(sub: str) -> None:
    proc = qq("eval", sub, "--help")
    assert proc.returncode == 0, proc.stderr
    assert "Examples:" in proc.stdout and f"qwenquant eval {sub}" in flat(proc.stdout)


def test_gates_lists_the_shipped_gates() -> None:
    proc = qq("eval", "gates", "--json")
    assert proc.returncode == 0, proc.stderr
    gates = json.loads(proc.stdout)
    assert [g["name"] for g in gates] == ["tiny-reference"] and gates[0]["cases"] == 5


def test_served_needs_a_url_or_serve() -> None:
    proc = qq("eval", "served")
    assert proc.returncode == 2
    assert "error: eval served needs the URL of a running server, or --serve ARTIFACT" in flat(proc.stderr)
