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
    assert cpu_threads() == 3 and thread_fields("cpu") == {"threads": "3"}
    assert thread_fields("cuda") == {} and thread_fields("cuda:1") == {}  # records of GPU builds unchanged
    monkeypatch.setenv("QWENQUANT_THREADS", "0")
    assert thread_fields("cpu") == {"threads": str(os.cpu_count() or 1)}  # 0: every core, the count recorded
