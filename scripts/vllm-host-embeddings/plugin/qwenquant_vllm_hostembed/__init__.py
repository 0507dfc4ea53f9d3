"""A vLLM general plugin: the input embedding table in pinned host memory, read by the GPU through UVA.

Qwen3.8-27B's input embedding table is 248,320 x 5,120 bf16: 2.37 GiB that a decode step touches one
row of per token. With `QWENQUANT_HOST_EMBEDDINGS=1` every plain `VocabParallelEmbedding` (never a
`ParallelLMHead`, whose whole matrix is read per token) is given, right after vLLM builds it, a weight
that lives in pinned host memory and that the GPU addresses directly through a unified-virtual-address
view (`vllm.utils.torch_utils.get_accelerator_view_from_cpu_tensor`, the function vLLM's own UVA
offloader uses). The Parameter object, its attributes and its weight loader stay vLLM's: the loader
copies the checkpoint's rows into the view as it would into GPU memory, and the GPU memory the layer
had is freed before vLLM measures its weights. vLLM's own `--cpu-offload-params embed_tokens` moves
nothing on this model: its offloader wraps decoder layers only (`models/utils.py:make_layers`).

Refusals (vLLM's start stops with the line, naming the variable): a platform other than CUDA (the CPU
build has no device memory to save), pinned memory unavailable (vLLM turns it off under WSL2 unless
told otherwise), UVA unavailable, or a tensor-parallel rank (each rank would pin its own shard; not
checked). Checked on: CUDA vLLM 0.26.0 (run); 0.33.0 and 0.34.0 read (same function and class).

Loaded by vLLM in every process through the `vllm.general_plugins` entry point; without the variable
it changes nothing.
"""

from __future__ import annotations

import logging
import os
from typing import Any

ENV = "QWENQUANT_HOST_EMBEDDINGS"

# under "vllm" so that vLLM's own log handler and format carry the line
log = logging.getLogger("vllm.qwenquant_vllm_hostembed")


def enabled() -> bool:
    """The switch: 1 on, 0 or unset off; anything else stops vLLM's start naming the variable."""
    value = os.environ.get(ENV, "").strip() or "0"
    if value not in ("0", "1"):
        raise ValueError(f"{ENV}={os.environ.get(ENV)!r}: expected 0 or 1")
    return value == "1"


def moves(layer: Any) -> bool:
    """Whether the layer's weight goes to host memory: a plain, unquantized vocabulary embedding.
    `ParallelLMHead` (a subclass) stays: the head's matrix is read whole for every token."""
    from vllm.model_executor.layers.vocab_parallel_embedding import (
        ParallelLMHead,
        UnquantizedEmbeddingMethod,
    )

    weight = getattr(layer, "weight", None)
    return (
        not isinstance(layer, ParallelLMHead)
        and isinstance(getattr(layer, "quant_method", None), UnquantizedEmbeddingMethod)
        and weight is not None
        and weight.dtype.is_floating_point
        and weight.numel() > 0
    )


def platform_problem() -> str | None:
    """Why this process cannot keep embeddings on the host, or None."""
    from vllm.platforms import current_platform

    if not current_platform.is_cuda():
        return f"{ENV}=1 needs a CUDA GPU; this vLLM runs on {current_platform.device_name}"
    from vllm.utils import platform_utils

    if not platform_utils.is_pin_memory_available():
        return (
            f"{ENV}=1 needs pinned host memory, which vLLM reports unavailable here (under WSL2 vLLM "
            "pins memory only with VLLM_WSL2_ENABLE_PIN_MEMORY=1 on a WSL2 kernel 4.19.121 or newer)"
        )
    uva = getattr(platform_utils, "is_uva_available", None)
    if uva is not None and not uva():
        return f"{ENV}=1 needs unified virtual addressing, which vLLM reports unavailable here"
    return None


def to_host(layer: Any) -> int:
    """Give the layer's weight pinned host storage seen by the GPU through UVA; the bytes moved."""
    import torch
    from vllm.utils.torch_utils import get_accelerator_view_from_cpu_tensor

    param = layer.weight
    host = torch.empty(param.shape, dtype=param.dtype, device="cpu", pin_memory=True)
    host.copy_(param.data.cpu())  # the loader overwrites it; a copy keeps any initial value vLLM set
    layer.qwenquant_host_weight = host  # the pinned storage lives as long as the layer
    param.data = get_accelerator_view_from_cpu_tensor(host)
    return host.numel() * host.element_size()


def register() -> None:
    """The entry point vLLM calls in each process: wrap VocabParallelEmbedding's constructor."""
    if not enabled():
        return
    from vllm.model_executor.layers import vocab_parallel_embedding as vpe

    cls = vpe.VocabParallelEmbedding
    if getattr(cls, "_qwenquant_host_wrapped", False):
        return
    original_init = cls.__init__
    checked: list[bool] = []

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        if not moves(self):
            return
        if not checked:
            problem = platform_problem()
            if problem:
                raise RuntimeError(problem)
            if getattr(self, "tp_size", 1) > 1:
                raise RuntimeError(
                    f"{ENV}=1 is not supported with tensor parallelism (each rank's shard "
                    "would be pinned separately; not checked)"
                )
            checked.append(True)
        moved = to_host(self)
        log.info(
            "qwenquant host embeddings: %s (%.2f GiB) in pinned host memory, read through UVA",
            getattr(self, "prefix", "") or type(self).__name__,
            moved / 1024**3,
        )

    cls.__init__ = __init__
    cls._qwenquant_host_wrapped = True
