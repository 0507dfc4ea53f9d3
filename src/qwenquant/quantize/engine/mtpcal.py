"""GPTQ for the MTP draft head (`mtp: {quantize: gptq}`), calibrated inside the streamed pass.

vLLM's drafter (`Qwen3_5MultiTokenPredictor`) sees, for position t, the target's final (post-norm)
hidden state at t and the embedding of token t+1. The streamed engine has both once the last decoder
layer ran: `headcal.calibrate` applies the final norm sample by sample and hands each calibration
sample's hidden states here, with the sample's tokens. The head's Linears (`mtp.fc` and its decoder
layer's q/k/v/o and gate/up/down projections) get Hessian hooks (engine/quantize.LayerGPTQ, the body's
llm-compressor steps) during one bf16 forward of the head per sample, as one subgraph (llm-compressor's
sequential pipeline calibrates every Linear of a subgraph on the unquantized inputs of that subgraph);
then GPTQ and packing. Norms stay bf16. The packed tensors go to `mtp-gptq/` inside the gptq stage
folder (covered by its record, never carried into the artifact); the mtp stage grafts them.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch

from qwenquant.checkpoint.names import MTP_PREFIX
from qwenquant.errors import StageError

FOLDER = "mtp-gptq"
TENSORS = "mtp.safetensors"


class MtpCalibration:
    """The MTP head built from the source's `mtp.*` tensors, with Hessian hooks on its target Linears."""

    def __init__(self, src: Any, q: Any, scheme: Any, device: str) -> None:
        from qwenquant.modeling.mtp import MTPHead
        from qwenquant.modeling.text import ref_tensor
        from qwenquant.quantize.engine.quantize import LayerGPTQ, target_modules

        names = [n for n in src.refs if n.startswith(MTP_PREFIX)]
        if not names:
            raise StageError(
                "mtp.quantize is gptq but the source checkpoint has no mtp.* tensors",
                hint="quantize a checkpoint with its MTP head, or drop `mtp: {quantize: gptq}`",
            )
        cfg = copy.deepcopy(src.config)
        cfg._attn_implementation = "sdpa"  # causal without a mask, as the head runs in eval and in vLLM
        head = MTPHead(cfg)
        head.load_state_dict({n[len(MTP_PREFIX) :]: ref_tensor(src.refs[n]) for n in names}, strict=True)
        for part in (head.fc, head.pre_fc_norm_embedding, head.pre_fc_norm_hidden, head.norm, head.layers):
            part.to(src.dtype)  # the checkpoint's dtype, as the decoder layers are calibrated (rotary kept float)
        self.head = head.to(device).eval()
        self.src, self.device = src, device
        self.modules = target_modules(self.head, MTP_PREFIX, q.targets, q.ignore)
        self.gptq = LayerGPTQ(
            self.modules,
            scheme,
            block_size=q.block_size,
            dampening_frac=q.dampening_frac,
            hessian_precision=q.hessian_precision,
        )
        self.samples = 0

    @torch.no_grad()
    def add(self, tokens: list[int], hidden: torch.Tensor) -> None:
        """One calibration sample: its tokens [T] and final hidden states [1, T, H]."""
        from qwenquant.modeling.text import embed_samples

        if len(tokens) < 2:
            return
        embeds = embed_samples(self.src, [tokens[1:]], self.device)[0]
        self.head(embeds, hidden[:, :-1].to(embeds.dtype))
        self.samples += 1

    def quantize(self) -> dict[str, dict[str, torch.Tensor]]:
        """GPTQ and pack every target Linear: full name -> {weight_packed, weight_scale, weight_shape}."""
        if not self.samples:
            raise StageError(
                "no calibration sample reached the MTP head (every sample is one token long)",
                hint="use calibration samples of at least two tokens",
            )
        packed = self.gptq.quantize()
        del self.head
        return packed


def save(stage_dir: Path, packed: dict[str, dict[str, torch.Tensor]]) -> None:
    """Write the packed MTP Linears into `stage_dir/mtp-gptq/` (deterministic bytes)."""
    from qwenquant.checkpoint.assemble import torch_raw
    from qwenquant.checkpoint.tensorfile import write_shard

    d = Path(stage_dir) / FOLDER
    d.mkdir(parents=True, exist_ok=True)
    write_shard(
        d / TENSORS, [torch_raw(f"{mod}.{leaf}", t) for mod, parts in packed.items() for leaf, t in parts.items()]
    )


def load_refs(stage_dir: Path) -> dict[str, Any] | None:
    """The packed MTP tensors a streamed gptq stage left (name -> TensorRef), or None."""
    from qwenquant.checkpoint.tensorfile import shard_refs

    p = Path(stage_dir) / FOLDER / TENSORS
    return shard_refs(p) if p.is_file() else None
