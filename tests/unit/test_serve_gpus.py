"""`qwenquant serve --gpus N`: the vLLM argv, the GPU checks, and the multicast-off environment.

The GPU checks read a stand-in `nvidia-smi` (a shell script on PATH printing fixed CSV rows):
no NVIDIA GPU is available to these tests, and the stand-in lets them set which GPU is busy.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from qwenquant.errors import QwenquantError, ServeError, UsageError
from qwenquant.procenv import child_env, multicast_off
from qwenquant.recipe import load_recipe
from qwenquant.serve.argv import build_vllm_argv, extra_pp, extra_tp
from qwenquant.serve.gpus import check_tp_device, gpu_table, tp_gpu_bytes

MANIFEST = {"recipe": {"artifact": {"layout": "text-only"}}}
# memory.total, memory.free in MiB, as `nvidia-smi --format=csv,noheader,nounits` prints them
TWO_FREE = "0, GPU-aaaa, 24576, 24000\n1, GPU-bbbb, 24576, 23900\n"
ONE_BUSY = "0, GPU-aaaa, 24576, 24000\n1, GPU-bbbb, 24576, 3000\n2, GPU-cccc, 24576, 24100\n"


def stand_in_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rows: str) -> None:
    """Put a stand-in nvidia-smi first on PATH that prints `rows` for the memory query."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\n" + "".join(f"echo '{row}'\n" for row in rows.splitlines()))
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))


def test_argv_adds_tensor_parallel_size():
    prof = load_recipe("w4a16-int4head").profile("single-user")
    a = build_vllm_argv(Path("/art"), prof, MANIFEST, "cuda", tp=2)
    i = a.index("--tensor-parallel-size")
    assert a[i + 1] == "2" and a.count("--tensor-parallel-size") == 1
    assert "--tensor-parallel-size" not in build_vllm_argv(Path("/art"), prof, MANIFEST, "cuda")
    # a flag after -- wins, in either spelling
    a = build_vllm_argv(Path("/art"), prof, MANIFEST, "cuda", ["-tp", "4"], tp=4)
    assert "--tensor-parallel-size" not in a and a[-2:] == ["-tp", "4"]
    assert extra_tp(["--max-model-len", "8", "--tensor-parallel-size=2"]) == 2 and extra_tp(["-tp", "4"]) == 4
    assert extra_tp(["--max-model-len", "8"]) is None


def test_argv_adds_pipeline_parallel_size():
    prof = load_recipe("w4a16-int4head").profile("single-user")
    a = build_vllm_argv(Path("/art"), prof, MANIFEST, "cuda", pp=2)
    assert a[a.index("--pipeline-parallel-size") + 1] == "2" and "--tensor-parallel-size" not in a
    assert "--pipeline-parallel-size" not in build_vllm_argv(Path("/art"), prof, MANIFEST, "cuda", tp=2)
    a = build_vllm_argv(Path("/art"), prof, MANIFEST, "cuda", ["-pp", "4"], pp=4)
    assert "--pipeline-parallel-size" not in a and a[-2:] == ["-pp", "4"]
    assert (
        extra_pp(["--pipeline-parallel-size=2"]) == 2 and extra_pp(["-pp", "4"]) == 4 and extra_pp(["-tp", "2"]) is None
    )


def test_gpus_free_plans_for_the_smallest(tmp_path, monkeypatch):
    stand_in_smi(tmp_path, monkeypatch, TWO_FREE)
    assert [g.index for g in gpu_table()] == ["0", "1"]
    assert tp_gpu_bytes(2, 0.92, {}) == 24576 * 2**20


def test_busy_gpu_is_named(tmp_path, monkeypatch):
    stand_in_smi(tmp_path, monkeypatch, ONE_BUSY)
    with pytest.raises(ServeError) as e:
        tp_gpu_bytes(2, 0.92, {})
    assert "GPU 1 has 2.93 GiB free of 24.00 GiB" in e.value.message and "GPU 0" not in e.value.message
    assert "lower --gpu-memory-utilization to 0.12" in e.value.hint  # 3000 / 24576 = 0.122
    # the same machine with the busy GPU left out by CUDA_VISIBLE_DEVICES (an index and a UUID)
    assert tp_gpu_bytes(2, 0.92, {"CUDA_VISIBLE_DEVICES": "0,GPU-cccc"}) == 24576 * 2**20


def test_too_few_visible_gpus(tmp_path, monkeypatch):
    stand_in_smi(tmp_path, monkeypatch, TWO_FREE)
    with pytest.raises(UsageError, match="over 4 GPUs needs 4 visible GPUs, 2 visible"):
        tp_gpu_bytes(4, 0.92, {})
    with pytest.raises(UsageError, match=r"2 GPUs needs 2 visible GPUs, 1 visible \(CUDA_VISIBLE_DEVICES=1\)"):
        tp_gpu_bytes(2, 0.92, {"CUDA_VISIBLE_DEVICES": "1"})
    with pytest.raises(ServeError, match="CUDA_VISIBLE_DEVICES names 7"):
        tp_gpu_bytes(2, 0.92, {"CUDA_VISIBLE_DEVICES": "0,7"})


def test_cpu_refuses_more_than_one_gpu():
    check_tp_device("cpu", 1)
    check_tp_device("cuda", 2)
    with pytest.raises(UsageError, match="--gpus 2 needs a CUDA vLLM build") as e:
        check_tp_device("cpu", 2)
    assert isinstance(e.value, QwenquantError) and e.value.exit_code == 2


def test_multicast_off_is_setdefault():
    added = multicast_off({"NCCL_NVLS_ENABLE": "1"})
    assert added == {"TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
    env = child_env({"PATH": "/bin", "NCCL_NVLS_ENABLE": "1"})
    assert env == {
        "PATH": "/bin",
        "NCCL_NVLS_ENABLE": "1",
        "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
        "NVSHMEM_DISABLE_NVLS": "1",
    }
    assert child_env({})["NCCL_NVLS_ENABLE"] == "0"
