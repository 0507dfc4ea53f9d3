"""The environments qwenquant gives its children: the vLLM server never inherits qwenquant's import path,
and the watchdog and ballast (run isolated, -I) find the package from their own file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from qwenquant.procenv import child_env, server_env


def test_the_server_does_not_inherit_qwenquants_import_path() -> None:
    """A PYTHONPATH set for qwenquant (say, a newer compressed-tensors) would shadow vLLM's own pins."""
    env = child_env(server_env({"PYTHONPATH": "/opt/quant-site", "PYTHONHOME": "/x", "HF_HOME": "/h"}))
    assert "PYTHONPATH" not in env and "PYTHONHOME" not in env
    assert env["HF_HOME"] == "/h" and env["NCCL_NVLS_ENABLE"] == "0"


def test_isolated_helpers_import_qwenquant_from_a_source_checkout(tmp_path: Path) -> None:
    """`python -I .../serve/ballast.py` from a checkout used through PYTHONPATH, by a python that has no
    qwenquant installed (the venv's base interpreter): the script finds its package next to itself
    (it then fails only on the missing GPU, or probes one)."""
    import qwenquant.serve.ballast as ballast

    base = getattr(sys, "_base_executable", sys.executable)
    probe = subprocess.run([base, "-I", "-c", "import qwenquant"], capture_output=True, text=True, timeout=60)
    assert probe.returncode != 0, f"{base} has qwenquant installed: this test needs an interpreter without it"
    r = subprocess.run(
        [base, "-I", ballast.__file__, "--probe"], capture_output=True, text=True, cwd=tmp_path, timeout=60
    )
    assert "No module named" not in r.stderr, r.stderr
    assert "ballast: " in r.stdout + r.stderr


def test_a_launcher_without_its_own_environment_keeps_the_path() -> None:
    """A --vllm python the user points at may rely on PYTHONPATH; only an isolated launcher drops it."""
    assert server_env({"PYTHONPATH": "/p"}, isolated=False)["PYTHONPATH"] == "/p"
