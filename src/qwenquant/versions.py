"""`qwenquant --version` and `qwenquant doctor`: versions from package metadata, never by importing.

The vLLM line comes from the launcher record scripts/install-vllm.sh writes
(`.venv-vllm/qwenquant-vllm.json`): importing vLLM takes seconds and lives in another environment.
"""

from __future__ import annotations

import json
import platform
import sys
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


def vllm_info() -> dict:
    """The vLLM `qwenquant serve` would launch, found as serve finds it (serve/discover.py): a
    launcher record is read; a python, a venv or an executable (--vllm, QWENQUANT_VLLM, PATH) is
    asked for its version (cached). {"version", "device", "torch", "path", "source"}, or {"problem"}."""
    from qwenquant.errors import QwenquantError
    from qwenquant.serve.discover import find_vllm, locate_vllm

    path, rec = launcher_record()
    if rec is not None:
        info = {
            "version": rec.get("vllm_version", "?"),
            "device": rec.get("device", "?"),
            "torch": rec.get("torch_version", "?"),
            "path": str(path),
            "source": "launcher record",
        }
        return _with_cpu_path(info, rec.get("python"), rec.get("isolated") is True)
    if path is not None:
        return {"problem": f"{path} is unreadable (re-run scripts/install-vllm.sh)", "path": str(path)}
    where, source = locate_vllm()
    if where is None:
        return {
            "problem": "no .venv-vllm/qwenquant-vllm.json (run scripts/install-vllm.sh; `qwenquant serve` "
            "would look for `vllm` on PATH)"
        }
    try:
        install = find_vllm()
    except QwenquantError as e:
        said = e.message if f"(from {source})" in e.message else f"{e.message} (from {source})"  # once, whoever says it
        return {"problem": said, "path": str(where), "source": source}
    info = {"version": install.version, "device": install.device, "torch": None, "path": str(where), "source": source}
    return _with_cpu_path(info, install.python, install.isolated)


def _with_cpu_path(info: dict, python: object, isolated: bool) -> dict:
    """`info` plus "cpu_w4a16" (serve/cpupath.py: the path vLLM's CPU build takes for W4A16 layers) for a CPU build."""
    if info.get("device") != "cpu" or not python:
        return info
    from qwenquant.errors import QwenquantError
    from qwenquant.serve.cpupath import cpu_w4a16_path

    try:
        p = cpu_w4a16_path(str(python), isolated=isolated)
        return {**info, "cpu_w4a16": {**p.to_json(), "line": p.line()}}
    except QwenquantError as e:
        return {
            **info,
            "cpu_w4a16": {
                "problem": f"{e.message}; {e.hint}",
                "line": f"vLLM CPU W4A16 path: cannot tell ({e.message}; {e.hint})",
            },
        }


def vllm_line(v: dict | None = None) -> str:
    """`vllm X (device[, torch T]) from PATH`, or `vllm: PROBLEM`, of `vllm_info()` (or `v`, already read)."""
    v = vllm_info() if v is None else v
    if "problem" in v:
        return f"vllm: {v['problem']}"
    if v["source"] == "launcher record":
        return f"vllm {v['version']} ({v['device']}, torch {v['torch']}) from {v['path']}"
    return f"vllm {v['version']} ({v['device']}) from {v['path']} ({v['source']})"


def vllm_table_row(v: dict) -> dict | None:
    """The version table's row (qwenquant.vllmcompat) of the vLLM in `v` (`vllm_info()`), as `doctor --json`
    prints it; None when no vLLM was found."""
    if "problem" in v:
        return None
    from qwenquant.vllmcompat import row_for
    from qwenquant.vllmcompat.render import row_dict

    version = v.get("version")
    return row_dict(
        row_for(version if version and version != "?" else None, "cpu" if v.get("device") == "cpu" else "cuda")
    )


def doctor_dict() -> dict:
    """`qwenquant doctor --json`: what `version_lines(True)` prints, as data."""
    info = vllm_info()
    return {
        "qwenquant": qwenquant_version(),
        "python": {"version": platform.python_version(), "executable": sys.executable},
        "packages": {name: dist_version(name) for name in STACK},
        "vllm": info,
        "vllm_table": vllm_table_row(info),
    }


def version_lines(verbose: bool) -> list[str]:
    """`qwenquant X.Y.Z`, and with `verbose` the quantization stack and the vLLM serve would launch."""
    lines = [f"qwenquant {qwenquant_version()}"]
    if not verbose:
        return lines
    lines.append(f"python {platform.python_version()} ({sys.executable})")
    lines += [f"{name} {dist_version(name)}" for name in STACK]
    info = vllm_info()  # once: it may ask the vLLM python (seconds)
    lines.append(vllm_line(info))
    cpu = info.get("cpu_w4a16")
    if cpu:
        lines.append(cpu["line"])
    row = vllm_table_row(info)
    if row is not None:
        from qwenquant.vllmcompat import row_for
        from qwenquant.vllmcompat.render import row_lines

        lines += row_lines(row_for(row["version"], row["build"]))
    return lines
