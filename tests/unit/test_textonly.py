"""text_only_config / text_only_name: pure rewrites for vLLM's Qwen3_5ForCausalLM."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import qwenquant
from qwenquant.quantize.stages.textonly import text_only_config, text_only_name

REFERENCE = Path(qwenquant.__file__).parent / "data" / "qwen3_8-27b.config.json"  # the real model's config


def _config() -> dict:
    if REFERENCE.exists():
        cfg = json.loads(REFERENCE.read_text())
    else:  # the reference's shape, reduced
        cfg = {
            "architectures": ["Qwen3_5ForConditionalGeneration"],
            "model_type": "qwen3_5",
            "tie_word_embeddings": False,
            "image_token_id": 248056,
            "vision_config": {"depth": 27},
            "text_config": {
                "model_type": "qwen3_5_text",
                "eos_token_id": 248044,
                "hidden_size": 5120,
                "rope_parameters": {
                    "mrope_interleaved": True,
                    "mrope_section": [11, 11, 10],
                    "partial_rotary_factor": 0.25,
                    "rope_theta": 10000000,
                    "rope_type": "default",
                },
            },
        }
    cfg["quantization_config"] = {"quant_method": "compressed-tensors", "ignore": ["re:^mtp.*"]}
    cfg["dtype"] = "bfloat16"
    return cfg


def test_architecture_and_model_type() -> None:
    out = text_only_config(_config())
    assert out["architectures"] == ["Qwen3_5ForCausalLM"]
    assert out["model_type"] == "qwen3_5_text"


def test_no_mrope_anywhere() -> None:
    out = text_only_config(_config())
    text = json.dumps(out)
    assert "mrope" not in text
    rope = out["rope_parameters"]
    assert rope["rope_theta"] == 10000000 and rope["partial_rotary_factor"] == 0.25
    assert rope["rope_type"] == "default"


def test_text_config_at_top_level_and_multimodal_keys_gone() -> None:
    src = _config()
    out = text_only_config(src)
    assert out["hidden_size"] == src["text_config"]["hidden_size"]
    assert out["eos_token_id"] == src["text_config"]["eos_token_id"]
    for key in ("text_config", "vision_config", "image_token_id"):
        assert key not in out


def test_keeps_quantization_config_dtype_and_untied_head() -> None:
    src = _config()
    out = text_only_config(src)
    assert out["quantization_config"] == src["quantization_config"]
    assert out["dtype"] == "bfloat16"
    assert out["tie_word_embeddings"] is False


def test_input_is_not_modified_and_rewrite_is_idempotent() -> None:
    src = _config()
    before = copy.deepcopy(src)
    once = text_only_config(src)
    assert src == before
    assert text_only_config(once) == once


def test_tensor_names() -> None:
    assert (
        text_only_name("model.language_model.layers.0.mlp.up_proj.weight_packed")
        == "model.layers.0.mlp.up_proj.weight_packed"
    )
    assert text_only_name("model.language_model.embed_tokens.weight") == "model.embed_tokens.weight"
    assert text_only_name("model.visual.blocks.0.attn.qkv.weight") is None
    assert text_only_name("lm_head.weight_packed") == "lm_head.weight_packed"
    assert text_only_name("mtp.fc.weight") == "mtp.fc.weight"
