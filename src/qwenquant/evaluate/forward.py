"""The forward eval runs both arms through: transformers' Qwen3.5 text model over dense float weights.

`final_hidden(ids)` (the post-final-norm hidden states, what lm_head and the MTP drafter see) and
`mtp_hidden(ids, hidden)` are the only two calls eval makes, so a layer-streamed forward (weights
onloaded one decoder layer at a time, for models larger than memory) can stand in for
`DenseForward` by offering the same two methods.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from qwenquant.errors import QwenquantError


class TextForward(Protocol):
    """What eval needs from a model."""

    def final_hidden(self, ids: torch.Tensor) -> torch.Tensor: ...

    def mtp_hidden(self, ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor | None: ...


class DenseForward:
    """The whole text model (and the MTP head, when the checkpoint has one) in memory on `device`."""

    def __init__(self, text_cfg: dict[str, Any], tensors: dict[str, torch.Tensor], device: str = "cpu") -> None:
        from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

        cfg = Qwen3_5TextConfig(
            **{k: v for k, v in text_cfg.items() if k not in ("architectures", "quantization_config")}
        )
        cfg._attn_implementation = "sdpa"
        self.device = torch.device(device)
        self.model = Qwen3_5ForCausalLM(cfg).float().eval()
        body = {k: v for k, v in tensors.items() if not k.startswith("mtp.")}
        missing, unexpected = self.model.load_state_dict(body, strict=False)
        if missing or unexpected:
            raise QwenquantError(
                f"checkpoint tensors do not match the Qwen3.5 text model (missing {missing[:3]}, "
                f"unexpected {unexpected[:3]})",
                hint="run `qwenquant check` on the folder",
            )
        self.model.to(self.device)
        self.mtp = self._load_mtp(cfg, tensors)

    def _load_mtp(self, cfg: Any, tensors: dict[str, torch.Tensor]) -> Any:
        from qwenquant.modeling.mtp import MTPHead

        mtp = {k[len("mtp.") :]: v for k, v in tensors.items() if k.startswith("mtp.")}
        if not mtp:
            return None
        head = MTPHead(cfg).float().eval()
        head.load_state_dict(mtp)
        return head.to(self.device)

    @torch.no_grad()
    def final_hidden(self, ids: torch.Tensor) -> torch.Tensor:
        """Post-final-norm hidden states [B, L, H] (float32) for ids [B, L]."""
        return self.model.model(input_ids=ids.to(self.device)).last_hidden_state.float()

    @torch.no_grad()
    def mtp_hidden(self, ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor | None:
        """MTP output [B, L-1, H] from hidden state t and token t+1 (apply lm_head for t+2); None without MTP."""
        if self.mtp is None:
            return None
        emb = self.model.model.embed_tokens(ids[:, 1:].to(self.device))
        return self.mtp(emb, hidden[:, :-1]).float()
