"""Run by .venv-vllm's python (tests/integration/test_plan_cache_vllm.py): the KV cache layout vLLM builds for a
Qwen3.5/3.8 config, from vLLM's own functions. Argument: JSON {"config": path, "cases": [...]}; prints one JSON line.

Only the few VllmConfig fields these functions read are given (a namespace, not a VllmConfig: building one needs the
checkpoint). What a running server discovers from its built layers is given here instead: the attention backend
(CPU_ATTN on the CPU build, FLASH_ATTN for CUDA's rule) and its KV cache layout.
"""

import json
import sys
from types import SimpleNamespace as NS

import torch
from vllm.model_executor.models.config import Qwen3_5ForConditionalGenerationConfig
from vllm.model_executor.models.qwen3_5 import Qwen3_5ForConditionalGeneration as Model
from vllm.platforms.cpu import CpuPlatform
from vllm.platforms.interface import Platform
from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE
from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend
from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts
from vllm.v1.core import kv_cache_utils as ku
from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec, get_kv_quant_mode

BACKENDS = {"cpu": (CpuPlatform, CPUAttentionBackend, 128), "cuda": (Platform, FlashAttentionBackend, 16)}


def vllm_config(text, case):
    """The fields of VllmConfig that the functions below read, as vLLM would set them for `case` (before the block
    size is aligned). Block size: CpuPlatform.check_and_update_config's 128 (platforms/cpu.py), CacheConfig's 16."""
    platform, backend, block = BACKENDS[case["device"]]
    spec = case["num_speculative_tokens"]
    model = NS(
        dtype=torch.bfloat16,
        use_mla=False,
        architecture="Qwen3_5ForConditionalGeneration",
        architectures=["Qwen3_5ForConditionalGeneration"],
        model_impl="auto",
        convert_type="none",
        is_hybrid=True,
        hf_text_config=text,
        hf_config=text,
        max_model_len=case["max_model_len"],
        get_num_kv_heads=lambda p: max(1, text.num_key_value_heads // p.tensor_parallel_size),  # ModelConfig's rule
        get_head_size=lambda: text.head_dim,
    )
    layout = get_supported_kv_cache_layouts([backend])[0]  # the backend's first choice (one backend)
    cache = NS(
        cache_dtype=case["kv_cache_dtype"],
        mamba_cache_dtype="auto",
        mamba_ssm_cache_dtype=case["mamba_ssm_cache_dtype"],
        mamba_cache_mode=case["mamba_cache_mode"],
        block_size=block,
        mamba_block_size=None,
        mamba_page_size_padded=None,
        user_specified_block_size=False,
        kv_cache_dtype_skip_layers=None,
        use_replayssm=False,
        num_gpu_blocks_override=None,
        prefix_cache_retention_interval=None,
        get_resolved_kv_cache_layout=lambda: layout,
    )
    speculative = None
    if spec:
        speculative = NS(
            method="mtp", num_speculative_tokens=spec, use_eagle=lambda: True, use_eagle_block_drop=lambda: True
        )
    return NS(
        model_config=model,
        cache_config=cache,
        parallel_config=NS(tensor_parallel_size=case.get("tp", 1), decode_context_parallel_size=1),
        speculative_config=speculative,
        num_speculative_tokens=spec,
        scheduler_config=NS(disable_hybrid_kv_cache_manager=False),
        attention_config=NS(hisparse_config=None),
        num_prefill_lookahead_tokens=1,  # read for sliding-window layers only: there are none
        device_config=NS(device_type=case["device"]),
    )


def layer_specs(text, v, backend):
    """One spec per cache layer, as Attention.get_kv_cache_spec and MambaBase.get_kv_cache_spec build them: the
    target's full-attention layers, its GDN layers, then the MTP drafter's attention layer(s) when it drafts."""
    cache = v.cache_config
    kv_dtype = v.model_config.dtype if cache.cache_dtype == "auto" else STR_DTYPE_TO_TORCH_DTYPE[cache.cache_dtype]
    attn = backend.customize_spec(
        FullAttentionSpec(
            block_size=cache.block_size,
            num_kv_heads=v.model_config.get_num_kv_heads(v.parallel_config),
            head_size=v.model_config.get_head_size(),
            dtype=kv_dtype,
            kv_quant_mode=get_kv_quant_mode(cache.cache_dtype),
        )
    )
    gdn = MambaSpec(
        shapes=tuple(Model.get_mamba_state_shape_from_config(v)),
        dtypes=tuple(Model.get_mamba_state_dtype_from_config(v)),
        block_size=cache.mamba_block_size,
        page_size_padded=cache.mamba_page_size_padded,
        mamba_cache_mode=cache.mamba_cache_mode,
        num_speculative_blocks=v.num_speculative_tokens,
    )
    kinds = text.layer_types or [  # Qwen3.5's config default: every full_attention_interval-th layer
        "full_attention" if (i + 1) % text.full_attention_interval == 0 else "linear_attention"
        for i in range(text.num_hidden_layers)
    ]
    specs = {}
    for i, kind in enumerate(kinds):
        name = f"language_model.model.layers.{i}." + ("self_attn.attn" if kind == "full_attention" else "linear_attn")
        specs[name] = attn if kind == "full_attention" else gdn
    if v.num_speculative_tokens:
        for i in range(text.mtp_num_hidden_layers):
            specs[f"mtp.layers.{len(kinds) + i}.self_attn.attn"] = attn
    return specs


def layout(text, case):
    platform, backend, _ = BACKENDS[case["device"]]
    v = vllm_config(text, case)

    class Discovered(platform):
        @classmethod
        def _find_non_ssm_backends(cls, vllm_config):
            return [backend]

    Qwen3_5ForConditionalGenerationConfig.verify_and_update_config(v)  # ssm cache dtype auto -> mamba_ssm_dtype
    Discovered.update_block_size_for_backend(v)
    if (
        v.cache_config.mamba_block_size is None
    ):  # mode none: MambaModelConfig.verify_and_update_config (models/config.py:709)
        v.cache_config.mamba_block_size = v.model_config.max_model_len
    specs = layer_specs(text, v, backend)
    groups = ku.get_kv_cache_groups(v, specs)
    kv = ku.get_kv_cache_config_from_groups(v, groups, case["available_memory"])
    group_rows = []
    for g in groups:
        s = g.kv_cache_spec
        per_layer = [s.kv_cache_specs[n] for n in g.layer_names] if hasattr(s, "kv_cache_specs") else [s]
        group_rows.append(
            {
                "kind": "attention" if isinstance(per_layer[0], FullAttentionSpec) else "gdn",
                "layers": len(g.layer_names),
                "blocks_per_request": ku.cdiv(s.max_memory_usage_bytes(v), s.page_size_bytes),
            }
        )
    gdn = next(s for s in specs.values() if isinstance(s, MambaSpec))
    attn = next(s for s in specs.values() if isinstance(s, FullAttentionSpec))
    return {
        "block_size": v.cache_config.block_size,
        "attn_page_1_token": attn.copy_with_new_block_size(1).page_size_bytes,
        "attn_page": attn.page_size_bytes,
        "gdn_state_bytes": gdn.real_page_size_bytes,
        "gdn_page": gdn.page_size_bytes,
        "groups": group_rows,
        "bytes_per_block": ku._get_kv_cache_bytes_per_block(groups, v.cache_config.get_resolved_kv_cache_layout()),
        "num_blocks": kv.num_blocks,
        "max_concurrency": ku.get_max_concurrency_for_kv_cache_config(v, kv),
        "auto_fit": auto_fit(v, specs, case["available_memory"]),
        "starts": [starts(v, specs, case["available_memory"], n) for n in case["starts"]],
        "ssm_dtype": str(gdn.dtypes[1]).removeprefix("torch."),
    }


def auto_fit(v, specs, available):
    """The max_model_len vLLM's `--max-model-len -1` (auto) fits in `available` on one worker (get_kv_cache_configs:
    the null block reserved, then _estimate_max_model_len_from_groups), from a derived length of 2**24 so that
    only memory bounds it."""
    v.model_config.original_max_model_len, v.model_config.max_model_len = -1, 1 << 24
    ku.get_kv_cache_configs(v, [dict(specs)], [available])
    return v.model_config.max_model_len


def starts(v, specs, available, max_model_len):
    """Whether vLLM's start-up check in get_kv_cache_configs passes one `max_model_len` sequence."""
    v.model_config.original_max_model_len = v.model_config.max_model_len = max_model_len
    try:
        ku.get_kv_cache_configs(v, [dict(specs)], [available])
    except ValueError:
        return False
    return True


def main():
    args = json.loads(sys.argv[1])
    with open(args["config"]) as f:
        config = json.load(f)
    text = NS(**config.get("text_config", config))
    print(json.dumps([layout(text, case) for case in args["cases"]]))


if __name__ == "__main__":
    main()
