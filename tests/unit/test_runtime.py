"""modeling/runtime.py: the one device resolver (quantize --device, the lm_head math, eval)."""

from __future__ import annotations

import pytest
import torch

from qwenquant.errors import UsageError
from qwenquant.modeling.runtime import resolve_device, torch_device


def test_default_is_cuda_when_visible_else_cpu() -> None:
    want = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device(None) == want and torch_device() == torch.device(want)


def test_an_explicit_device_is_kept() -> None:
    assert resolve_device("cpu") == "cpu"
    assert torch_device(torch.device("cpu")) == torch.device("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_a_cuda_device_is_refused_with_a_hint() -> None:
    for asked in ("cuda", torch.device("cuda", 0)):
        with pytest.raises(UsageError) as e:  # needs a GPU: the usage code, as serve's --gpus and --gpu-mem
            resolve_device(asked)
        assert e.value.message.endswith("but no CUDA device is visible") and e.value.exit_code == 2
        assert e.value.hint == "drop --device, or use --device cpu"
    with pytest.raises(UsageError, match="--device cuda but no CUDA device is visible"):
        torch_device("cuda")


def test_the_cpu_thread_count_is_a_stage_input_on_the_cpu_only(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from qwenquant.modeling.runtime import cpu_threads, thread_fields

    monkeypatch.setenv("QWENQUANT_THREADS", "3")
    monkeypatch.delenv("MKL_CBWR", raising=False)
    assert cpu_threads() == 3 and thread_fields("cpu") == {"threads": "3", "mkl_cbwr": "AUTO"}
    assert os.environ["MKL_CBWR"] == "AUTO"  # the mode recorded is the mode set for the stage's compute
    assert thread_fields("cuda") == {} and thread_fields("cuda:1") == {}  # records of GPU builds unchanged
    monkeypatch.setenv("QWENQUANT_THREADS", "0")
    monkeypatch.setenv("MKL_CBWR", "COMPATIBLE")  # the user's own mode is kept, and recorded as an input
    assert thread_fields("cpu") == {"threads": str(os.cpu_count() or 1), "mkl_cbwr": "COMPATIBLE"}


def _python(code: str, **env: str) -> str:
    """Run `code` in a fresh interpreter (the runtimes read their variables when they load) with `env`
    added to this one's; its stdout (a failure shows its stderr)."""
    import os
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env={**os.environ, **env}
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_set_deterministic_turns_off_openmp_dynamic_teams() -> None:
    """With OMP_DYNAMIC=true the OpenMP runtime sizes each parallel region by the load average, so
    the thread count that splits the sums would follow other work on the machine: set_deterministic
    turns that off for the thread that computes (a fresh process: the runtime reads the variable
    when it loads)."""

    code = (
        "import ctypes, os\n"
        "import torch\n"
        "from qwenquant.modeling.runtime import set_deterministic\n"
        "def dynamic():  # the runtime torch loaded: global symbols, else its library by path\n"
        "    libs = [None] + [line.split()[-1] for line in open('/proc/self/maps')\n"
        "                     if os.path.basename(line.split()[-1]).startswith(('libgomp', 'libiomp', 'libomp'))]\n"
        "    for lib in libs:\n"
        "        try:\n"
        "            return ctypes.CDLL(lib).omp_get_dynamic()\n"
        "        except (AttributeError, OSError):\n"
        "            pass\n"
        "before = dynamic()\n"
        "set_deterministic(threads=2)\n"
        "print(before, dynamic(), torch.get_num_threads())\n"
    )
    printed = _python(code, OMP_DYNAMIC="true").split()
    if printed[0] == "None":
        pytest.skip("torch here has no OpenMP runtime")
    assert printed == ["1", "0", "2"]  # dynamic on as the environment asked, then off


def test_set_deterministic_leaves_mkl_no_dynamic_thread_count() -> None:
    """MKL (inside torch's CPU build: the GPTQ Cholesky and float32 matmuls) may run a call on fewer
    threads than asked while its dynamic mode is on, its default (MKL_DYNAMIC): after
    set_deterministic every MKL call runs with dynamic mode off on the count asked for (torch's
    set_num_threads turns it off; MKL_VERBOSE's `Dyn:` and `NThr:` fields of each call say so)."""

    if not torch.backends.mkl.is_available():
        pytest.skip("torch here is built without MKL")
    code = (
        "import torch\n"
        "from qwenquant.modeling.runtime import set_deterministic\n"
        "set_deterministic(threads=2)\n"
        "x = torch.randn(256, 768)\n"
        "h = x.t() @ x + torch.eye(768)\n"
        "torch.cholesky_inverse(torch.linalg.cholesky(h))\n"
    )
    printed = _python(code, MKL_VERBOSE="1", MKL_DYNAMIC="TRUE")
    calls = [line for line in printed.splitlines() if line.startswith("MKL_VERBOSE ") and " NThr:" in line]
    names = {line.split()[1].split("(")[0] for line in calls}
    assert {"SGEMM", "SPOTRF", "SPOTRI"} <= names, printed[-2000:]
    assert all(" Dyn:0 " in line and line.endswith(" NThr:2") for line in calls), calls
