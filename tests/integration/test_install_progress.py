"""The install scripts are never silent for minutes: each phase prints a step line with the elapsed
time and a heartbeat while pip runs (scripts/progress.sh, run here in bash; no package is installed)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def bash(script: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-c", f"set -euo pipefail; . scripts/progress.sh; {script}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, QWENQUANT_HEARTBEAT="1"),
    )


def test_heartbeat_while_a_phase_runs_then_its_duration() -> None:
    r = bash('with_heartbeat "installing something" sleep 3; echo after')
    assert r.returncode == 0 and r.stdout == "after\n"
    lines = r.stderr.splitlines()
    assert re.fullmatch(r"==> \[0m0\ds\] installing something", lines[0])
    assert any(re.fullmatch(r"    \.\.\. still installing something \(\d+ s\)", ln) for ln in lines[1:-1])
    assert re.fullmatch(r"==> \[0m0\ds\] installing something: done in \d+ s", lines[-1])


def test_a_failing_phase_says_so_and_keeps_its_exit_code() -> None:
    r = bash('with_heartbeat "breaking" sh -c "exit 3"')
    assert r.returncode == 3
    assert r.stderr.splitlines()[-1].endswith("breaking: failed (exit 3) after 0 s")


def test_every_pip_install_in_the_scripts_runs_under_a_heartbeat() -> None:
    for name in ("install.sh", "install-vllm.sh"):
        text = (REPO / "scripts" / name).read_text().replace("\\\n", " ")
        assert ". scripts/progress.sh" in text
        installs = [
            ln
            for ln in text.splitlines()
            if re.search(r"pip\S*\"?\s.*\binstall\b", ln, re.I)
            and not ln.lstrip().startswith("#")
            and "download" not in ln
            and "uninstall" not in ln
        ]
        assert installs, name
        for ln in installs:
            assert "with_heartbeat" in ln, f"{name}: pip runs without progress: {ln.strip()}"
