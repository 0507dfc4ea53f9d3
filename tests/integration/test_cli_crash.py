"""An unexpected error (a bug): exit 1, one error line, and a hint naming the crash file that holds
the traceback, without QWENQUANT_DEBUG=1 and without a re-run.

The bug is induced by a test-only command registered on the real app in a child process (nothing
in qwenquant fails on purpose); everything after the raise is the real CLI.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from qwenquant.crash import redact_argv

BUGGY = r"""
import sys
import typer
from qwenquant.cli import app, main

@app.command("induced-bug")
def induced_bug(api_key: str = typer.Option("", "--api-key")) -> None:
    '''Examples: none'''
    def deep_inside() -> None:
        {}["missing"]
    try:
        deep_inside()
    except KeyError as e:
        raise RuntimeError("induced failure") from e

sys.exit(main(sys.argv[1:]))
"""


def _crash(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess, Path | None]:
    environ = {k: v for k, v in os.environ.items() if k != "QWENQUANT_DEBUG"}
    environ.update(QWENQUANT_NO_PROGRESS="1", **env)
    r = subprocess.run(
        [sys.executable, "-c", BUGGY, "induced-bug", "--api-key", "s3cret-value"],
        capture_output=True,
        text=True,
        timeout=120,
        env=environ,
        cwd=tmp_path,
    )
    named = re.search(r"its traceback is in (\S+): attach", " ".join(r.stderr.split()))
    return r, Path(named.group(1)) if named else None


def test_unexpected_error_writes_its_traceback_to_the_file_the_hint_names(tmp_path: Path) -> None:
    r, crash = _crash(tmp_path, XDG_STATE_HOME=str(tmp_path / "state"))
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert lines[0] == "error: RuntimeError: induced failure"
    assert "Traceback" not in r.stderr
    assert crash is not None and crash.parent == tmp_path / "state" / "qwenquant", r.stderr
    assert re.fullmatch(r"crash-\d{8}T\d{6}Z-\d+\.txt", crash.name)
    text = crash.read_text()
    assert "Traceback (most recent call last)" in text
    assert "in deep_inside" in text and "KeyError: 'missing'" in text  # the cause, not only the last frame
    assert text.rstrip().endswith("RuntimeError: induced failure")
    assert "command: qwenquant induced-bug --api-key ***" in text
    assert "s3cret-value" not in text


def test_crash_file_falls_back_to_the_temporary_folder(tmp_path: Path) -> None:
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")  # the state folder cannot be created under a file
    (tmp_path / "tmp").mkdir()
    r, crash = _crash(tmp_path, XDG_STATE_HOME=str(blocked), TMPDIR=str(tmp_path / "tmp"))
    assert r.returncode == 1
    assert crash is not None and crash.parent.parent == tmp_path / "tmp", r.stderr
    assert "RuntimeError: induced failure" in crash.read_text()


def test_debug_prints_the_traceback_too(tmp_path: Path) -> None:
    r, crash = _crash(tmp_path, XDG_STATE_HOME=str(tmp_path / "state"), QWENQUANT_DEBUG="1")
    assert r.returncode == 1 and "Traceback (most recent call last)" in r.stderr
    assert crash is not None and crash.is_file()


def test_secret_option_values_are_redacted() -> None:
    assert redact_argv(["qwenquant", "serve", "A", "--api-key", "k1", "--hf-token=t1", "--port", "8000"]) == [
        "qwenquant",
        "serve",
        "A",
        "--api-key",
        "***",
        "--hf-token=***",
        "--port",
        "8000",
    ]
