"""`qwenquant --help` and every `qwenquant CMD --help` stay light: no torch, transformers,
llm-compressor or huggingface_hub import, and fast enough to feel instant."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "transformers", "llmcompressor", "compressed_tensors", "huggingface_hub", "datasets")

PROBE = r"""
import io, json, sys, contextlib
from qwenquant.cli import main
argv = json.loads(sys.argv[1])
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    rc = main(argv)
heavy = sorted(m for m in sys.modules if m.split(".")[0] in HEAVY)
print(json.dumps({"rc": rc, "heavy": heavy, "out": buf.getvalue()}))
""".replace("HEAVY", repr(HEAVY))


def _commands() -> list[str]:
    import typer.main

    from qwenquant.cli import app

    group = typer.main.get_group(app)
    return sorted(group.commands)


def _run(argv: list[str]) -> dict:
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argv)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_root_help_lists_pipeline_commands_without_heavy_imports() -> None:
    res = _run(["--help"])
    assert res["rc"] == 0
    assert res["heavy"] == []
    for cmd in ("fetch",):
        assert cmd in res["out"]


@pytest.mark.parametrize("cmd", _commands())
def test_command_help_is_light_and_has_examples(cmd: str) -> None:
    res = _run([cmd, "--help"])
    assert res["rc"] == 0
    assert res["heavy"] == [], f"`qwenquant {cmd} --help` imported {res['heavy']}"
    assert "Example" in res["out"] or "example" in res["out"], f"`qwenquant {cmd} --help` has no examples"


@pytest.mark.parametrize(
    "argv, needle",
    [(["nosuch"], "No such command"), (["fetch", "--workers", "abc", "--out", "x"], "Invalid value for '--workers'")],
)
def test_usage_errors_exit_2_without_traceback(argv: list[str], needle: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "qwenquant", *argv], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert needle in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("group", [[], ["bench"], ["eval"], ["recipe"]])
def test_command_lists_show_each_summary_unbroken(group: list[str]) -> None:
    """On a terminal wide enough, each command's summary (its help's first paragraph) is one row of the
    list, not broken where its docstring's source lines end."""
    import os

    proc = subprocess.run(
        [sys.executable, "-m", "qwenquant", *group, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, COLUMNS="400"),
    )
    rows = [ln.strip("│ ").rstrip() for ln in proc.stdout.splitlines() if ln.startswith("│ ")]
    commands = [r for r in rows if r and not r.startswith("-") and not r.startswith(" ")]
    assert commands, proc.stdout
    for row in commands:  # no continuation rows: each starts with a command name and ends its sentence
        assert row.endswith((".", ")", "`")), f"a summary broken mid-sentence: {row!r}"


def test_version_is_light() -> None:
    from importlib.metadata import version

    res = _run(["--version"])
    assert res["rc"] == 0 and res["heavy"] == []
    assert res["out"] == f"qwenquant {version('qwenquant')}\n"


def test_version_verbose_names_the_stack_and_the_vllm_serve_would_launch(tmp_path) -> None:
    """The vLLM line is read from the launcher record, never by importing vLLM."""
    import os
    from importlib.metadata import version

    record = tmp_path / "qwenquant-vllm.json"
    record.write_text(json.dumps({"vllm_version": "9.8.7", "device": "cuda", "torch_version": "2.99.0"}))
    for argv in (["--version", "--verbose"], ["doctor"]):
        proc = subprocess.run(
            [sys.executable, "-c", PROBE, json.dumps(argv)],
            capture_output=True,
            text=True,
            timeout=60,
            env=dict(os.environ, QWENQUANT_VLLM=str(record)),
        )
        res = json.loads(proc.stdout.strip().splitlines()[-1])
        assert res["rc"] == 0 and res["heavy"] == [], res
        lines = res["out"].splitlines()
        for dist in ("torch", "transformers", "llmcompressor", "compressed-tensors"):
            assert f"{dist} {version(dist)}" in lines
        assert f"vllm 9.8.7 (cuda, torch 2.99.0) from {record}" in lines
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(["doctor", "--json"])],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, QWENQUANT_VLLM=str(record)),
    )
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["rc"] == 0 and res["heavy"] == [], res
    doc = json.loads(res["out"])
    assert doc["vllm"] == {
        "version": "9.8.7",
        "device": "cuda",
        "torch": "2.99.0",
        "path": str(record),
        "source": "launcher record",
    }
    assert doc["packages"]["torch"] == version("torch") and doc["qwenquant"] == version("qwenquant")


def test_doctor_asks_the_python_or_venv_that_qwenquant_vllm_names(tmp_path) -> None:
    """QWENQUANT_VLLM naming the vLLM environment's python, or a venv folder holding only bin/python:
    doctor finds it as serve does (serve/discover.locate_vllm) and names the version that python
    reports, the one its launcher record holds."""
    import os

    from helpers import LAUNCHER, REPO, require_vllm

    require_vllm(LAUNCHER, "the vLLM environment (.venv-vllm)")
    rec = json.loads(LAUNCHER.read_text())
    python = REPO / ".venv-vllm" / "bin" / "python"
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(python.resolve())
    for named, where in ((python, python), (venv, venv / "bin" / "python")):
        proc = subprocess.run(
            [sys.executable, "-m", "qwenquant", "doctor"],
            capture_output=True,
            text=True,
            timeout=600,
            env=dict(os.environ, QWENQUANT_VLLM=str(named)),
            cwd=tmp_path,
        )
        assert proc.returncode == 0, proc.stderr
        lines = proc.stdout.splitlines()
        vllm = f"vllm {rec['vllm_version']} ({rec['device']}) from {where} (QWENQUANT_VLLM)"
        assert vllm in lines, proc.stdout
        if rec["device"] == "cpu":  # the CPU build's W4A16 path, asked of that same python, follows
            assert lines[lines.index(vllm) + 1].startswith("vLLM CPU W4A16 path: "), proc.stdout


def test_doctor_names_a_missing_qwenquant_vllm_once(tmp_path) -> None:
    import os

    proc = subprocess.run(
        [sys.executable, "-m", "qwenquant", "doctor"],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, QWENQUANT_VLLM=str(tmp_path / "nonexistent")),
        cwd=tmp_path,
    )
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("vllm:"))
    assert line == f"vllm: vLLM not found at {tmp_path / 'nonexistent'} (from QWENQUANT_VLLM)", proc.stdout


def test_exit_codes_are_documented_once_and_match_the_error_kinds() -> None:
    """One table (commands/_app.py) shown in `qwenquant --help`, repeated in README, matching errors.py."""
    from pathlib import Path

    from qwenquant import errors
    from qwenquant.commands._app import EXIT_CODES

    table = dict(EXIT_CODES)
    kinds = {c.exit_code for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.QwenquantError)}
    assert kinds <= set(table)
    out = " ".join(_run(["--help"])["out"].split())
    readme = " ".join((Path(__file__).resolve().parents[2] / "README.md").read_text().split())
    for code, kind in EXIT_CODES:
        assert f"{code} {kind}" in out
        assert f"| {code} | {kind} |" in readme
    from qwenquant.commands._app import EXIT_RULES

    for kind, code, rule in EXIT_RULES:  # the rule per kind of mistake sits next to the table
        assert code in table and f"| {kind} | {code} | {rule} |" in readme
