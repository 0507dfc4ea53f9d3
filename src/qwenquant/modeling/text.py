"""The text model around the decoder layers, rebuilt from the source shards one piece at a time.

Replicates what transformers' `Qwen3_5TextModel.forward` does for a batch-1, unpadded, text-only
sample (transformers 5.17, `models/qwen3_5/modeling_qwen3_5.py`): token embeddings; position ids
`arange(T)` as 4 rows (row 0 text positions for masks and attention, rows 1-3 the identical mrope
rows for the rotary embedding); one causal mask for `full_attention` layers and the recurrent mask
for `linear_attention` layers; each `Qwen3_5DecoderLayer` built by transformers itself; the final
offset RMSNorm. Attention is forced to eager, as llm-compressor's calibration context does, so
both engines run the same kernels. Nothing here holds more than one decoder layer's weights.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from qwenquant.checkpoint.tensorfile import TensorRef
from qwenquant.errors import StageError

TORCH_DTYPES = {
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F32": torch.float32,
    "I32": torch.int32,
    "I64": torch.int64,
}


def ref_tensor(ref: TensorRef | Any, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A tensor from its raw safetensors bytes (one read, no second copy)."""
    if ref.dtype not in TORCH_DTYPES:
        raise StageError(
            f"tensor {ref.name} has dtype {ref.dtype}; the engine reads BF16/F16/F32 (and int packed tensors)",
            hint="convert the checkpoint to bf16",
        )
    buf = ref.read_bytearray() if hasattr(ref, "read_bytearray") else bytearray(ref.read())
    t = (
        torch.frombuffer(buf, dtype=TORCH_DTYPES[ref.dtype]).reshape(ref.shape)
        if buf
        else torch.empty(ref.shape, dtype=TORCH_DTYPES[ref.dtype])
    )
    return t if dtype is None or not t.is_floating_point() else t.to(dtype)


@dataclass(frozen=True)
class TextModelSource:
    """Where the text model's tensors live in a source checkpoint, and its config."""

    config: Any  # transformers Qwen3_5TextConfig, eager attention
    prefix: str  # "model.language_model." (multimodal) or "model." (text-only)
    refs: Mapping[str, TensorRef]
    dtype: torch.dtype

    @property
    def num_layers(self) -> int:
        return int(self.config.num_hidden_layers)

    def layer_prefix(self, i: int) -> str:
        return f"{self.prefix}layers.{i}."

    def layer_names(self, i: int) -> list[str]:
        p = self.layer_prefix(i)
        return sorted(n for n in self.refs if n.startswith(p))

    def is_layer_tensor(self, name: str) -> bool:
        return re.match(re.escape(self.prefix) + r"layers\.\d+\.", name) is not None


def open_source(source_dir: Path, refs: Mapping[str, TensorRef]) -> TextModelSource:
    """The text config (eager attention) and tensor name prefix of a Qwen3.5 checkpoint."""
    import transformers

    cfg = transformers.AutoConfig.from_pretrained(str(source_dir))
    text = cfg.get_text_config()
    text._attn_implementation = "eager"  # what llm-compressor's calibration_forward_context forces
    prefix = next(
        (
            n[: -len("embed_tokens.weight")]
            for n in sorted(refs)
            if n.endswith("embed_tokens.weight") and not n.startswith("mtp.")
        ),
        None,
    )
    if prefix is None:
        raise StageError(f"{source_dir}: no embed_tokens.weight tensor", hint="is this a Qwen3.5 checkpoint?")
    dtype = getattr(text, "dtype", None) or getattr(cfg, "dtype", None) or torch.bfloat16
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    return TextModelSource(text, prefix, refs, dtype)


def build_layer(src: TextModelSource, i: int, tensors: Mapping[str, torch.Tensor], device: str) -> torch.nn.Module:
    """transformers' own `Qwen3_5DecoderLayer` i, built on the meta device and given `tensors`
    (names relative to the layer), cast to the model dtype as `from_pretrained(dtype="auto")` does."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer

    with torch.device("meta"):
        layer = Qwen3_5DecoderLayer(src.config, i)
    state = {n: (t.to(src.dtype) if t.is_floating_point() else t) for n, t in tensors.items()}
    missing = sorted(set(layer.state_dict()) - set(state))
    if missing:
        raise StageError(
            f"decoder layer {i}: tensors missing from the source: {', '.join(missing[:5])}",
            hint="the checkpoint does not match its config.json",
        )
    layer.load_state_dict(state, strict=True, assign=True)
    return layer.to(device).eval()


def read_layer(src: TextModelSource, i: int) -> dict[str, torch.Tensor]:
    """Layer i's source tensors, names relative to the layer."""
    p = src.layer_prefix(i)
    return {n[len(p) :]: ref_tensor(src.refs[n]) for n in src.layer_names(i)}


def embed_samples(src: TextModelSource, samples: list[list[int]], device: str) -> list[torch.Tensor]:
    """Embeddings of the calibration tokens ([1, T, H] each), reading only the rows they use."""
    ref = src.refs[f"{src.prefix}embed_tokens.weight"]
    rows, hidden = ref.shape
    width = ref.nbytes // rows
    used = sorted({t for s in samples for t in s})
    if used and (used[0] < 0 or used[-1] >= rows):
        raise StageError(
            f"calibration token id {used[-1]} is outside the {rows}-row embedding",
            hint="the calibration set was tokenized for another model",
        )
    table: dict[int, torch.Tensor] = {}
    with open(ref.path, "rb") as f:
        for t in used:
            f.seek(ref.start + t * width)
            table[t] = torch.frombuffer(bytearray(f.read(width)), dtype=TORCH_DTYPES[ref.dtype]).to(src.dtype)
    return [torch.stack([table[t] for t in s]).unsqueeze(0).to(device) for s in samples]


class LayerInputs:
    """Per-sample-length position embeddings and masks (the same for every layer of a type)."""

    def __init__(self, src: TextModelSource, device: str) -> None:
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5TextRotaryEmbedding

        self.src = src
        self.device = device
        self.rotary = Qwen3_5TextRotaryEmbedding(config=src.config).to(device)
        self._cache: dict[int, dict[str, Any]] = {}

    def kwargs(self, hidden: torch.Tensor, layer_type: str) -> dict[str, Any]:
        """Keyword arguments of the decoder layer call for one [1, T, H] sample."""
        T = int(hidden.shape[1])
        if T not in self._cache:
            self._cache.clear()  # samples usually share a length or come sorted; keep one entry
            self._cache[T] = self._build(hidden)
        c = self._cache[T]
        return {
            "position_embeddings": c["pos_emb"],
            "attention_mask": c["masks"][layer_type],
            "position_ids": c["text_pos"],
        }

    def _build(self, hidden: torch.Tensor) -> dict[str, Any]:
        from transformers.masking_utils import create_causal_mask, create_recurrent_attention_mask

        T = int(hidden.shape[1])
        pos = torch.arange(T, device=hidden.device).view(1, 1, -1).expand(4, 1, -1)
        text_pos, mrope_pos = pos[0], pos[1:]
        attention_mask = torch.ones((1, T), dtype=torch.long, device=hidden.device)
        mk = {
            "config": self.src.config,
            "inputs_embeds": hidden,
            "attention_mask": attention_mask,
            "past_key_values": None,
            "position_ids": text_pos,
        }
        masks = {"full_attention": create_causal_mask(**mk), "linear_attention": create_recurrent_attention_mask(**mk)}
        return {"pos_emb": self.rotary(hidden, mrope_pos), "masks": masks, "text_pos": text_pos}


def final_norm(src: TextModelSource, device: str) -> torch.nn.Module:
    """The text model's final offset RMSNorm with its source weight."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5RMSNorm

    norm = Qwen3_5RMSNorm(src.config.hidden_size, eps=src.config.rms_norm_eps)
    norm.weight.data = ref_tensor(src.refs[f"{src.prefix}norm.weight"], src.dtype)
    return norm.to(device).eval()
