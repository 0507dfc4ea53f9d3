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

from qwenquant import envs

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
    """(path, contents) of the qwenquant-vllm.json that `qwenquant serve` would use, without probing."""
    from qwenquant.serve.discover import LAUNCHER_JSON, repo_root

    env = envs.get("QWENQUANT_VLLM")
    candidates = [Path(env).expanduser()] if env else []
    candidates += [Path(env).expanduser() / LAUNCHER_JSON] if env else []
    candidates += [root / ".venv-vllm" / LAUNCHER_JSON for root in dict.fromkeys((repo_root(), Path.cwd()))]
    for p in candidates:
        if p.is_file() and p.name == LAUNCHER_JSON:
            try:
                return p, json.loads(p.read_text())
            except (OSError, ValueError):
                return p, None
    return None, None


def version_lines(verbose: bool) -> list[str]:
    """`qwenquant X.Y.Z`, and with `verbose` the quantization stack and the vLLM serve would launch."""
    lines = [f"qwenquant {qwenquant_version()}"]
    if not verbose:
        return lines
    lines.append(f"python {platform.python_version()} ({os.sys.executable})")
    lines += [f"{name} {dist_version(name)}" for name in STACK]
    path, rec = launcher_record()
    if path is None:
        lines.append("vllm: no .venv-vllm/qwenquant-vllm.json (run scripts/install-vllm.sh; "
                     "`qwenquant serve` would look for `vllm` on PATH)")
    elif rec is None:
        lines.append(f"vllm: {path} is unreadable (re-run scripts/install-vllm.sh)")
    else:
        lines.append(f"vllm {rec.get('vllm_version', '?')} ({rec.get('device', '?')}, torch "
                     f"{rec.get('torch_version', '?')}) from {path}")
        if rec.get("device") == "cpu" and rec.get("python"):
            lines.append(cpu_path_line(str(rec["python"]), rec.get("isolated") is True))
    return lines


def cpu_path_line(python: str, isolated: bool) -> str:
    """Which path vLLM's CPU build takes for W4A16 layers, asked of the vLLM python (seconds)."""
    from qwenquant.errors import QwenquantError
    from qwenquant.serve.cpupath import cpu_w4a16_path

    try:
        return cpu_w4a16_path(python, isolated=isolated).line()
    except QwenquantError as e:
        return f"vLLM CPU W4A16 path: cannot tell ({e.message}; {e.hint})"
