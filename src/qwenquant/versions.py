"""`qwenquant --version` and `qwenquant doctor`: versions from package metadata, never by importing.

The vLLM line comes from the launcher record scripts/install-vllm.sh writes
(`.venv-vllm/qwenquant-vllm.json`): importing vLLM takes seconds and lives in another environment.
"""

from __future__ import annotations

import json
import os
import platform
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

STACK = ("torch", "transformers", "llmcompressor", "compressed-tensors", "huggingface_hub", "safetensors")


def dist_version(name: str) -> str:
    """The installed version of distribution `name`, or "not installed"."""
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def qwenquant_version() -> str:
    from qwenquant import __version__

    got = dist_version("qwenquant")
    return __version__ if got == "not installed" else got


def launcher_record() -> tuple[Path | None, dict | None]:
    """(path, contents) of the qwenquant-vllm.json that `qwenquant serve` would use, without probing
    (path None when serve would launch a python or an executable instead: `vllm_line` probes it)."""
    from qwenquant.serve.discover import LAUNCHER_JSON, locate_vllm

    p, _ = locate_vllm()
    if p is None or p.name != LAUNCHER_JSON or not p.is_file():
        return None, None
    try:
        return p, json.loads(p.read_text())
    except (OSError, ValueError):
        return p, None


def vllm_line() -> str:
    """The vLLM `qwenquant serve` would launch, found as serve finds it (serve/discover.py): a
    launcher record is read; a python, a venv or an executable (--vllm, QWENQUANT_VLLM, PATH) is
    asked for its version (cached)."""
    from qwenquant.errors import QwenquantError
    from qwenquant.serve.discover import find_vllm, locate_vllm

    path, rec = launcher_record()
    if rec is not None:
        return (f"vllm {rec.get('vllm_version', '?')} ({rec.get('device', '?')}, torch "
                f"{rec.get('torch_version', '?')}) from {path}")
    if path is not None:
        return f"vllm: {path} is unreadable (re-run scripts/install-vllm.sh)"
    where, source = locate_vllm()
    if where is None:
        return ("vllm: no .venv-vllm/qwenquant-vllm.json (run scripts/install-vllm.sh; "
                "`qwenquant serve` would look for `vllm` on PATH)")
    try:
        install = find_vllm()
    except QwenquantError as e:
        return f"vllm: {e.message} (from {source})"
    return f"vllm {install.version} ({install.device}) from {where} ({source})"


def version_lines(verbose: bool) -> list[str]:
    """`qwenquant X.Y.Z`, and with `verbose` the quantization stack and the vLLM serve would launch."""
    lines = [f"qwenquant {qwenquant_version()}"]
    if not verbose:
        return lines
    lines.append(f"python {platform.python_version()} ({os.sys.executable})")
    lines += [f"{name} {dist_version(name)}" for name in STACK]
    lines.append(vllm_line())
    return lines
