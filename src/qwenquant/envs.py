"""Every QWENQUANT_* environment variable, declared once with its type, default and meaning.

qwenquant reads them only through `get(name)` (`get("QWENQUANT_THREADS")`), so `VARIABLES` is the
whole list; the README's table is generated from it (`python -m qwenquant.envs`).
tests/unit/test_envs.py checks that the two agree, that every QWENQUANT_* name in the repository
is declared here and that no module reads one from `os.environ` itself. An empty value counts as
unset. vLLM's envs.py is the model.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qwenquant.errors import UsageError


@dataclass(frozen=True)
class EnvVar:
    """One variable: `parse` turns a set value into what readers get; `unset` is what they get otherwise."""

    name: str
    type: str
    default: str
    meaning: str
    parse: Callable[[str], Any] = str
    unset: Any = None
    read_by: str = "qwenquant"  # qwenquant | qwenquant, for its child processes | scripts/... | tests


def _flag(value: str) -> bool:
    """0 or 1; anything else ("yes", "2") is refused rather than read as off."""
    if value not in ("0", "1"):
        raise ValueError("must be 0 or 1")
    return value == "1"


def _path(value: str) -> Path:
    return Path(value).expanduser()


def _folder(value: str) -> Path:
    """A folder that exists: a typo would otherwise list nothing and find no NAME, silently."""
    path = _path(value)
    if not path.is_dir():
        raise ValueError("must be an existing folder")
    return path


def _number(kind: type, what: str, low: float | None = None, high: float | None = None) -> Callable[[str], Any]:
    """A parser of `kind` whose values lie in [low, high]; its error says the allowed range."""
    allowed = (
        what
        if low is None and high is None
        else (f"{what} >= {low:g}" if high is None else f"{what} from {low:g} to {high:g}")
    )

    def parse(value: str) -> Any:
        try:
            number = kind(value)
        except ValueError:
            raise ValueError(f"must be {allowed}") from None
        if not math.isfinite(number) or (low is not None and number < low) or (high is not None and number > high):
            raise ValueError(f"must be {allowed}")
        return number

    return parse


def _positive(value: str) -> float:
    """A number > 0 (a cap in GiB)."""
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not math.isfinite(number) or number <= 0:
        raise ValueError("must be a number > 0")
    return number


def _choice(*names: str) -> Callable[[str], str]:
    def parse(value: str) -> str:
        if value not in names:
            raise ValueError(f"must be {' or '.join(names)}")
        return value

    return parse


_INT = _number(int, "an integer")
_FLOAT = _number(float, "a number")

_DECLARED = (
    # What a user sets.
    EnvVar(
        "QWENQUANT_DEBUG",
        "0/1",
        "0",
        "1: print an error's traceback on stderr too (an unexpected error's is "
        "always written to the crash file its hint names)",
        _flag,
        False,
    ),
    EnvVar("QWENQUANT_NO_PROGRESS", "0/1", "0", "1: no progress bars, even on a terminal", _flag, False),
    EnvVar(
        "QWENQUANT_THREADS",
        "integer from 0 to 4096",
        "0 (every core)",
        "CPU threads of torch in quantize and "
        "eval; `quantize --gpus N` on the CPU shares them among the ranks; on the CPU an input of the build "
        "(another count writes other bytes; recorded in the manifest)",
        _number(int, "an integer", 0, 4096),
        0,
    ),
    EnvVar(
        "QWENQUANT_GPTQ_ENGINE",
        "streamed or oneshot",
        "streamed",
        "the gptq stage's engine: one decoder layer at a time (resumable), or llm-compressor's whole-model `oneshot`",
        _choice("streamed", "oneshot"),
        "streamed",
    ),
    EnvVar(
        "QWENQUANT_MAX_GPU_MEM",
        "GiB (number > 0)",
        "unset (no cap)",
        "cap the streamed GPTQ engine's CUDA memory (23.5: a bigger GPU behaves like a 24 GB card)",
        _positive,
    ),
    EnvVar(
        "QWENQUANT_DIST_TIMEOUT_MIN",
        "minutes (integer from 1 to 10080)",
        "30",
        "how long a collective of `quantize --gpus N` waits for the slowest rank",
        _number(int, "an integer", 1, 10080),
        30,
    ),
    EnvVar(
        "QWENQUANT_FETCH_BACKOFF",
        "seconds (number from 0 to 600)",
        "0.5",
        "first wait before a download is retried (doubles each retry)",
        _number(float, "a number", 0, 600),
        0.5,
    ),
    EnvVar(
        "QWENQUANT_VLLM",
        "path",
        "unset",
        "the vLLM to launch: a python or vllm executable, a venv, or its "
        "qwenquant-vllm.json (after `--vllm`, before `.venv-vllm`)",
        _path,
    ),
    EnvVar(
        "QWENQUANT_VLLM_CPU_W4A16",
        "auto or dense",
        "auto",
        "vLLM's CPU build: `dense` forces the W4A16 "
        "fallback (int4 weights dequantized at load, dense matmul) that `auto` takes only where vLLM's CPU "
        "extension lacks cpu_gemm_wna16 (no AVX-512); `doctor` and `serve --dry-run` say which path runs",
        _choice("auto", "dense"),
        "auto",
        read_by="qwenquant, for its child processes",
    ),
    EnvVar(
        "QWENQUANT_HOST_EMBEDDINGS",
        "0/1",
        "0",
        "1: vLLM keeps the input embedding table in pinned host memory, "
        "read by the GPU through UVA (scripts/vllm-host-embeddings/plugin; CUDA only, one GPU)",
        _flag,
        False,
        read_by="vLLM, through qwenquant's plugin",
    ),
    EnvVar(
        "QWENQUANT_API_KEY", "string", "unset", "`serve --api-key` / `bench --api-key` when the option is not given"
    ),
    EnvVar(
        "QWENQUANT_RECIPES_DIR",
        "folder",
        "the shipped recipes",
        "where `--recipe NAME` and `recipe list` look",
        _folder,
    ),
    EnvVar(
        "QWENQUANT_CALIBRATION_DIR",
        "folder",
        "the shipped calibration sets",
        "where `--calibration NAME` looks",
        _folder,
    ),
    EnvVar(
        "QWENQUANT_EVALTEXT_DIR", "folder", "the shipped eval text sets", "where `eval --text-set NAME` looks", _folder
    ),
    # What qwenquant sets for the processes it starts (the ranks of `quantize --gpus N`).
    EnvVar(
        "QWENQUANT_PARENT_PID",
        "integer >= 1",
        "unset",
        "a rank exits when this process (its launcher) is gone",
        _number(int, "an integer", 1),
        read_by="qwenquant, for its child processes",
    ),
    EnvVar(
        "QWENQUANT_LOG_LEVEL",
        "integer from 0 to 50",
        "20 (INFO)",
        "a rank's logging level (the launcher's)",
        _number(int, "an integer", 0, 50),
        20,
        read_by="qwenquant, for its child processes",
    ),
    # The install scripts.
    EnvVar("QWENQUANT_VENV", "path", ".venv", "the venv scripts/install.sh creates", read_by="scripts/install.sh"),
    EnvVar(
        "QWENQUANT_TORCH_INDEX",
        "URL",
        "unset (CPU wheel without a GPU)",
        "the package index torch comes from",
        read_by="scripts/install.sh",
    ),
    EnvVar(
        "QWENQUANT_VLLM_VENV",
        "path",
        ".venv-vllm",
        "the venv scripts/install-vllm.sh creates",
        read_by="scripts/install-vllm.sh",
    ),
    EnvVar(
        "QWENQUANT_VLLM_DEVICE",
        "cpu or cuda",
        "cuda when nvidia-smi works",
        "which vLLM build to install",
        read_by="scripts/install-vllm.sh",
    ),
    EnvVar(
        "QWENQUANT_VLLM_SPEC",
        "pip requirement",
        "the pinned vLLM",
        "install another vLLM (`vllm==0.34.0`)",
        read_by="scripts/install-vllm.sh",
    ),
    EnvVar(
        "QWENQUANT_HEARTBEAT",
        "seconds",
        "30",
        "how often a long install step says it is still running",
        read_by="scripts/progress.sh",
    ),
    # The test suite.
    EnvVar(
        "QWENQUANT_UPDATE_GOLDEN",
        "0/1",
        "0",
        "1: rewrite the golden files instead of comparing with them",
        read_by="tests",
    ),
    EnvVar(
        "QWENQUANT_BALLAST_STANDIN",
        "path",
        "unset",
        "the `--gpu-mem` ballast touches no GPU, holds nothing, "
        "takes free memory from --free-before and writes its report to this file (tests without a GPU)",
        _path,
        read_by="tests",
    ),
)

VARIABLES: dict[str, EnvVar] = {v.name: v for v in _DECLARED}


def get(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """The parsed value of `name` in `environ` (default: os.environ), or its `unset` value.

    KeyError for a name not declared here (a typo in the code); UsageError for a value that does
    not parse (`QWENQUANT_THREADS=two`)."""
    var = VARIABLES[name]
    raw = (os.environ if environ is None else environ).get(name, "")
    if raw == "":
        return var.unset
    try:
        return var.parse(raw)
    except ValueError as e:
        raise UsageError(
            f"{name} {e}, got {raw!r}", hint=f"unset {name}, or set it to {var.type} (README: Environment variables)"
        ) from None


def check_all(environ: Mapping[str, str] | None = None) -> None:
    """Parse every variable qwenquant itself reads (UsageError naming the first one set out of its
    range): a command refuses a bad value before it starts, not where it first reads it."""
    for var in _DECLARED:
        if var.read_by == "qwenquant":
            get(var.name, environ)


def markdown_table() -> str:
    """The README's table of the variables."""
    rows = ["| variable | value | default | meaning | read by |", "|---|---|---|---|---|"]
    rows += [f"| `{v.name}` | {v.type} | {v.default} | {v.meaning} | {v.read_by} |" for v in _DECLARED]
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(markdown_table(), end="")
