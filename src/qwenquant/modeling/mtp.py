"""Qwen3.5's multi-token-prediction head as a torch module (for training and offline evaluation).

Same computation as vLLM's `Qwen3_5MultiTokenPredictor` for one draft step: the target's final
(post-norm) hidden state at t and the embedding of token t+1 go through `pre_fc_norm_hidden` /
`pre_fc_norm_embedding`, are concatenated [embedding; hidden], projected by `fc`, pass one
full-attention decoder layer and `norm`; the shared lm_head then predicts token t+2.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class MTPHead(nn.Module):
    """The 15 `mtp.*` tensors of a Qwen3.5 checkpoint; `state_dict()` keys are the names without `mtp.`."""

    def __init__(self, text_config: Any) -> None:
        from transformers.models.qwen3_5.modeling_qwen3_5 import (
            Qwen3_5DecoderLayer,
            Qwen3_5RMSNorm,
            Qwen3_5TextRotaryEmbedding,
        )

        super().__init__()
        h, eps = text_config.hidden_size, text_config.rms_norm_eps
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.pre_fc_norm_embedding = Qwen3_5RMSNorm(h, eps=eps)
        self.pre_fc_norm_hidden = Qwen3_5RMSNorm(h, eps=eps)
        self.norm = Qwen3_5RMSNorm(h, eps=eps)
        full = text_config.layer_types.index("full_attention")
        self.layers = nn.ModuleList([Qwen3_5DecoderLayer(text_config, full)])
        self.rotary = Qwen3_5TextRotaryEmbedding(text_config)

    def forward(self, embeds_next: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """Final MTP hidden state [B, S, H] from embeddings of tokens t+1 and target hidden states at t
        (both [B, S, H]); apply the shared lm_head to get logits for t+2."""
        x = torch.cat([self.pre_fc_norm_embedding(embeds_next), self.pre_fc_norm_hidden(hidden)], dim=-1)
        x = self.fc(x)
        batch, seq = x.shape[:2]
        positions = torch.arange(seq, device=x.device).expand(3, batch, seq)
        rope = self.rotary(x, positions)
        x = self.layers[0](x, position_embeddings=rope, position_ids=positions[0])
        return self.norm(x)
