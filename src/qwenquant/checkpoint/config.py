"""A checkpoint folder's config.json and safetensors index, read one way everywhere."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from qwenquant.checkpoint.header import INDEX_NAME
from qwenquant.errors import UsageError

CONFIG_NAME = "config.json"


def read_config(folder: Path) -> dict[str, Any]:
    """config.json of a checkpoint or artifact folder, or a UsageError naming the file."""
    path = Path(folder) / CONFIG_NAME
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"{folder} has no {CONFIG_NAME}", hint="pass a checkpoint or artifact folder") from None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise UsageError(
            f"{path} is not readable JSON ({e})".splitlines()[0], hint="re-fetch or rebuild the folder"
        ) from None
    if not isinstance(config, dict):
        raise UsageError(f"{path} is not a JSON object", hint="re-fetch or rebuild the folder")
    return config


def text_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The text model's config: `text_config` of a multimodal config, else the config itself."""
    tc = config.get("text_config")
    return dict(tc if isinstance(tc, Mapping) else config)


def read_weight_map(folder: Path) -> dict[str, str] | None:
    """tensor name -> shard file, from the folder's index; None when the folder has no index."""
    path = Path(folder) / INDEX_NAME
    if not path.is_file():
        return None
    return dict(json.loads(path.read_text())["weight_map"])


def mtp_shapes(config: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """name -> shape of every `mtp.*` tensor the text config implies (empty without an MTP head, or
    when the config lacks a size it needs: the caller reports that config). Qwen3.5 layout: fc
    [H, 2H], three norms [H], and per layer one full-attention block (gated q_proj) and an MLP."""
    tc = text_config(config)
    try:
        layers = int(tc.get("mtp_num_hidden_layers") or 0)
        hidden, inter, heads = int(tc["hidden_size"]), int(tc["intermediate_size"]), int(tc["num_attention_heads"])
        kv, hd = int(tc.get("num_key_value_heads", heads)), int(tc.get("head_dim") or hidden // heads)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return {}
    q_rows = heads * hd * (2 if tc.get("attn_output_gate", True) else 1)
    out: dict[str, tuple[int, ...]] = (
        {}
        if layers <= 0
        else {
            "mtp.fc.weight": (hidden, 2 * hidden),
            "mtp.pre_fc_norm_embedding.weight": (hidden,),
            "mtp.pre_fc_norm_hidden.weight": (hidden,),
            "mtp.norm.weight": (hidden,),
        }
    )
    for i in range(max(layers, 0)):
        p = f"mtp.layers.{i}."
        out.update(
            {
                p + "input_layernorm.weight": (hidden,),
                p + "post_attention_layernorm.weight": (hidden,),
                p + "self_attn.q_proj.weight": (q_rows, hidden),
                p + "self_attn.k_proj.weight": (kv * hd, hidden),
                p + "self_attn.v_proj.weight": (kv * hd, hidden),
                p + "self_attn.o_proj.weight": (hidden, heads * hd),
                p + "self_attn.q_norm.weight": (hd,),
                p + "self_attn.k_norm.weight": (hd,),
                p + "mlp.gate_proj.weight": (inter, hidden),
                p + "mlp.up_proj.weight": (inter, hidden),
                p + "mlp.down_proj.weight": (hidden, inter),
            }
        )
    return out
