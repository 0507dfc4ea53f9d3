"""Plain transformers/torch forwards that check a tiny checkpoint independently of qwenquant's own
modeling code (tests/integration/test_tiny.py).

transformers has no MTP module, so `mtp_logits` rebuilds Qwen3.5's MTP head from transformers'
own decoder layer: fc(concat(pre_fc_norm_embedding(embed(next_token)), pre_fc_norm_hidden(h))),
one full-attention layer, mtp.norm, the shared lm_head.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from qwenquant.testbed.tiny.build import read_index


def load_tensors(checkpoint: Path) -> dict[str, torch.Tensor]:
    """Every tensor named in the checkpoint's index, as float32."""
    from safetensors.torch import load_file

    checkpoint = Path(checkpoint)
    out: dict[str, torch.Tensor] = {}
    for shard in sorted(set(read_index(checkpoint).values())):
        out.update({k: v.float() for k, v in load_file(checkpoint / shard).items()})
    return out


def fake_quant_int4(weight: torch.Tensor, group_size: int = 128) -> torch.Tensor:
    """Round-to-nearest symmetric int4 (-8..7) per group of `group_size` input columns, dequantized."""
    rows, cols = weight.shape
    w = weight.float().reshape(rows, cols // group_size, group_size)
    scale = (w.abs().amax(dim=-1, keepdim=True) / 7).clamp(min=1e-8)
    return ((w / scale).round().clamp(-8, 7) * scale).reshape(rows, cols)


def _text_config(checkpoint: Path) -> Any:
    from transformers import Qwen3_5Config

    cfg = Qwen3_5Config(**json.loads((Path(checkpoint) / "config.json").read_text())).text_config
    cfg._attn_implementation = "sdpa"  # causal without an explicit mask
    return cfg


def mtp_logits(
    checkpoint: Path, tensors: dict[str, torch.Tensor], input_ids: torch.Tensor, hidden: torch.Tensor
) -> torch.Tensor:
    """Logits of the MTP head at each position i < S-1, from token i+1 and target hidden state i.

    `tensors` are the checkpoint's tensors (possibly altered, e.g. fake-quantized); `hidden` is the
    target model's last hidden state [B, S, H].
    """
    from transformers.models.qwen3_5.modeling_qwen3_5 import (
        Qwen3_5DecoderLayer,
        Qwen3_5RMSNorm,
        Qwen3_5TextRotaryEmbedding,
    )

    cfg = _text_config(checkpoint)
    full = cfg.layer_types.index("full_attention")
    layer = Qwen3_5DecoderLayer(cfg, full)
    layer.load_state_dict({k[len("mtp.layers.0.") :]: v for k, v in tensors.items() if k.startswith("mtp.layers.0.")})

    def norm(name: str, x: torch.Tensor) -> torch.Tensor:
        n = Qwen3_5RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        n.weight.data = tensors[name]
        return n(x)

    next_ids = input_ids[:, 1:]
    emb = norm("mtp.pre_fc_norm_embedding.weight", tensors["model.language_model.embed_tokens.weight"][next_ids])
    hid = norm("mtp.pre_fc_norm_hidden.weight", hidden[:, :-1].float())
    x = torch.cat([emb, hid], dim=-1) @ tensors["mtp.fc.weight"].T
    batch, seq = next_ids.shape
    positions = torch.arange(seq).expand(3, batch, seq)
    rope = Qwen3_5TextRotaryEmbedding(cfg)(x, positions)
    with torch.no_grad():
        x = layer(x, position_embeddings=rope, position_ids=positions[0])
        x = norm("mtp.norm.weight", x)
    return x @ tensors["lm_head.weight"].T
