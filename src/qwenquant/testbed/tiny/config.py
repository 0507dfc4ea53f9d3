"""Dimensions and the JSON files of the tiny checkpoint (pure: dicts in, dicts out)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from qwenquant.testbed.tiny import tokenizer


@dataclass(frozen=True)
class TinyDims:
    """Shapes of the tiny model.

    Every Linear's in/out features are multiples of 32 (vLLM's CPU int4 kernel) and every Linear the
    recipe quantizes has in_features a multiple of 128 (group size 128). The exceptions are the GDN
    `in_proj_a`/`in_proj_b` (out = value heads = 4), which recipes keep in bf16 as on the 27B.
    """

    hidden: int = 256
    intermediate: int = 512
    layers: int = 4  # 3 linear_attention + 1 full_attention (every 4th)
    full_attention_interval: int = 4
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 64
    linear_key_heads: int = 2
    linear_value_heads: int = 4
    linear_head_dim: int = 64
    conv_kernel: int = 4
    vocab: int = 1024
    vision_depth: int = 2
    vision_hidden: int = 64
    vision_intermediate: int = 128
    vision_heads: int = 2
    vision_positions: int = 2304
    patch_size: int = 16
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2

    def layer_types(self) -> list[str]:
        return [
            "full_attention" if (i + 1) % self.full_attention_interval == 0 else "linear_attention"
            for i in range(self.layers)
        ]


DIMS = TinyDims()


def model_config(dims: TinyDims = DIMS, tokenizer_text: str | None = None) -> dict[str, Any]:
    """`config.json`, key for key the shape of the real Qwen3.8-27B config (token ids from
    `tokenizer_text`, a `tokenizer.json`; default the tiny tokenizer)."""
    ids = tokenizer.token_ids(tokenizer_text)
    if ids["size"] > dims.vocab:
        raise ValueError(f"tokenizer has {ids['size']} tokens, more than the {dims.vocab}-row vocab")
    return {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "dtype": "bfloat16",
        "torch_dtype": "bfloat16",
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
        "tie_word_embeddings": False,
        "text_config": _text_config(dims, ids),
        "vision_config": _vision_config(dims),
    }


def _text_config(dims: TinyDims, ids: dict[str, int]) -> dict[str, Any]:
    """config.json's text_config: the 27B's keys with the tiny widths."""
    rotary = 0.25
    # mrope sections split the rotary frequency pairs 3:3:2 (the 27B splits 32 pairs 11:11:10)
    pairs = int(dims.head_dim * rotary) // 2
    mrope = [pairs // 3 + (1 if i < pairs % 3 else 0) for i in range(3)]
    return {
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attn_output_gate": True,
        "dtype": "bfloat16",
        "eos_token_id": ids["<|endoftext|>"],
        "full_attention_interval": dims.full_attention_interval,
        "head_dim": dims.head_dim,
        "hidden_act": "silu",
        "hidden_size": dims.hidden,
        "initializer_range": 0.02,
        "intermediate_size": dims.intermediate,
        "layer_types": None,
        "linear_conv_kernel_dim": dims.conv_kernel,
        "linear_key_head_dim": dims.linear_head_dim,
        "linear_num_key_heads": dims.linear_key_heads,
        "linear_num_value_heads": dims.linear_value_heads,
        "linear_value_head_dim": dims.linear_head_dim,
        "mamba_ssm_dtype": "float32",
        "max_position_embeddings": 4096,
        "model_type": "qwen3_5_text",
        "mtp_num_hidden_layers": 1,
        "mtp_use_dedicated_embeddings": False,
        "num_attention_heads": dims.heads,
        "num_hidden_layers": dims.layers,
        "num_key_value_heads": dims.kv_heads,
        "partial_rotary_factor": rotary,
        "rms_norm_eps": 1e-06,
        "rope_parameters": {
            "mrope_interleaved": True,
            "mrope_section": mrope,
            "partial_rotary_factor": rotary,
            "rope_theta": 10000000,
            "rope_type": "default",
        },
        "tie_word_embeddings": False,
        "use_cache": True,
        "vocab_size": dims.vocab,
    }


def _vision_config(dims: TinyDims) -> dict[str, Any]:
    """config.json's vision_config: the 27B's keys with the tiny tower's widths."""
    return {
        "deepstack_visual_indexes": [],
        "depth": dims.vision_depth,
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_size": dims.vision_hidden,
        "in_channels": 3,
        "initializer_range": 0.02,
        "intermediate_size": dims.vision_intermediate,
        "model_type": "qwen3_5",
        "num_heads": dims.vision_heads,
        "num_position_embeddings": dims.vision_positions,
        "out_hidden_size": dims.hidden,
        "patch_size": dims.patch_size,
        "spatial_merge_size": dims.spatial_merge_size,
        "temporal_patch_size": dims.temporal_patch_size,
    }


def generation_config(tokenizer_text: str | None = None) -> dict[str, Any]:
    """`generation_config.json`. Greedy on purpose: vLLM takes sampling defaults from this file, and
    temperature > 0 under speculative decoding is broken on vLLM's CPU build (docs/known-issues.md#cpu-spec-sampling)."""
    ids = tokenizer.token_ids(tokenizer_text)
    return {
        "bos_token_id": ids["<|endoftext|>"],
        "do_sample": False,
        "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
        "pad_token_id": ids["<|endoftext|>"],
    }


def _processor_common(dims: TinyDims) -> dict[str, Any]:
    return {
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "merge_size": dims.spatial_merge_size,
        "patch_size": dims.patch_size,
        "temporal_patch_size": dims.temporal_patch_size,
        "processor_class": "Qwen3VLProcessor",
    }


def preprocessor_config(dims: TinyDims = DIMS) -> dict[str, Any]:
    """`preprocessor_config.json`: a Qwen2-VL-style image processor matching the vision tower."""
    side = dims.patch_size * dims.spatial_merge_size
    return {
        **_processor_common(dims),
        "image_processor_type": "Qwen2VLImageProcessorFast",
        "size": {"longest_edge": 64 * side * side, "shortest_edge": 4 * side * side},
    }


def video_preprocessor_config(dims: TinyDims = DIMS) -> dict[str, Any]:
    """`video_preprocessor_config.json`: the Qwen3-VL video processor matching the vision tower."""
    side = dims.patch_size * dims.spatial_merge_size
    return {
        **_processor_common(dims),
        "video_processor_type": "Qwen3VLVideoProcessor",
        "fps": 2,
        "min_frames": 4,
        "max_frames": 16,
        "do_sample_frames": True,
        "size": {"longest_edge": 16 * 64 * side * side, "shortest_edge": 4 * side * side},
    }
