"""A real-shaped, truncated Qwen3.5 checkpoint for benchmarks: the 27B's widths, N decoder layers.

Dimensions come from the reference config (src/qwenquant/data/qwen3_8-27b.config.json, or a copy)
with overrides: `layers` text layers (every 4th full attention, as on the 27B), a depth-1 vision
tower (dropped by the text-only layout anyway) and, for CPU proofs, `scale` shrinking hidden/MLP
widths and head counts while keeping every quantized in_features a multiple of 128.

Tensor names and shapes reuse the tiny builder (`qwenquant.testbed.tiny.weights.body_specs/mtp_specs`, which
take any `TinyDims`); values are drawn here, one seeded torch.Generator per tensor on the chosen
device (GPU when present: seconds at real dims), and streamed shard by shard through the project's
raw safetensors writer, so host RAM holds one tensor at a time (the 248320 x 5120 embedding: 2.5 GB).
The tokenizer is the tiny builder's (1018 tokens); config vocab_size stays 248320, so token ids are
all < 1018, which is fine for timing and memory. Values depend on seed and device (CPU and CUDA
generators differ); the JSON report records both.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qwenquant.checkpoint.tensorfile import TensorSpec
from qwenquant.testbed.tiny import tokenizer as tiny_tokenizer
from qwenquant.testbed.tiny.config import TinyDims, generation_config, preprocessor_config, video_preprocessor_config
from qwenquant.testbed.tiny.weights import body_specs, mtp_specs

DEFAULT_REFERENCE = Path(__file__).resolve().parents[1] / "src" / "qwenquant" / "data" / "qwen3_8-27b.config.json"
# The shape-bearing fields of the reference config, for runs without the repository's data folder
# (the GPU machine gets the repository only). `reference_config` checks them against the file.
REFERENCE_27B: dict[str, Any] = {
    "architectures": ["Qwen3_5ForConditionalGeneration"],
    "model_type": "qwen3_5",
    "image_token_id": 248056,
    "video_token_id": 248057,
    "vision_start_token_id": 248053,
    "vision_end_token_id": 248054,
    "tie_word_embeddings": False,
    "text_config": {
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attn_output_gate": True,
        "eos_token_id": 248044,
        "full_attention_interval": 4,
        "head_dim": 256,
        "hidden_act": "silu",
        "hidden_size": 5120,
        "initializer_range": 0.02,
        "intermediate_size": 17408,
        "layer_types": None,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 48,
        "linear_value_head_dim": 128,
        "mamba_ssm_dtype": "float32",
        "max_position_embeddings": 262144,
        "model_type": "qwen3_5_text",
        "mtp_num_hidden_layers": 1,
        "mtp_use_dedicated_embeddings": False,
        "num_attention_heads": 24,
        "num_hidden_layers": 64,
        "num_key_value_heads": 4,
        "partial_rotary_factor": 0.25,
        "rms_norm_eps": 1e-06,
        "rope_parameters": {
            "mrope_interleaved": True,
            "mrope_section": [11, 11, 10],
            "partial_rotary_factor": 0.25,
            "rope_theta": 10000000,
            "rope_type": "default",
        },
        "tie_word_embeddings": False,
        "use_cache": True,
        "vocab_size": 248320,
    },
    "vision_config": {
        "deepstack_visual_indexes": [],
        "depth": 27,
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_size": 1152,
        "in_channels": 3,
        "initializer_range": 0.02,
        "intermediate_size": 4304,
        "model_type": "qwen3_5",
        "num_heads": 16,
        "num_position_embeddings": 2304,
        "out_hidden_size": 5120,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
    },
}
MTP_SHARD = "model-mtp.safetensors"
MAX_SHARD_BYTES = 5 * 10**9
STD = {"linear": 0.02, "offset": 0.02, "scale": 0.02, "bias": 0.02, "conv": 0.25, "dt_bias": 0.05}


def _round(x: float, multiple: int) -> int:
    return max(multiple, int(round(x / multiple)) * multiple)


def reference_config(path: Path | None = None) -> tuple[dict[str, Any], str]:
    """(the real model's config, where it came from): the file when present (checked against the
    embedded copy, so the two cannot drift apart silently), else the embedded REFERENCE_27B."""
    p = Path(path) if path else DEFAULT_REFERENCE
    if not p.is_file():
        if path:
            raise FileNotFoundError(f"reference config {p} not found")
        return copy.deepcopy(REFERENCE_27B), "embedded copy of qwen3_8-27b.config.json"
    ref = json.loads(p.read_text())
    if path is None and ref != REFERENCE_27B:
        raise ValueError(f"{p} differs from benchmarks/shapes.py REFERENCE_27B: update the embedded copy")
    return ref, str(p)


def bench_dims(ref: dict[str, Any], *, layers: int, scale: float = 1.0, vocab: int | None = None) -> TinyDims:
    """Dims of the benchmark model: the reference's, `layers` deep, widths times `scale` (<= 1)."""
    t, v = ref["text_config"], ref["vision_config"]
    if scale >= 1.0:
        vision = dict(
            vision_hidden=v["hidden_size"], vision_intermediate=v["intermediate_size"], vision_heads=v["num_heads"]
        )
        hidden, inter = t["hidden_size"], t["intermediate_size"]
        heads, kv = t["num_attention_heads"], t["num_key_value_heads"]
        lk, lv = t["linear_num_key_heads"], t["linear_num_value_heads"]
    else:  # small CPU proof: same structure, fewer heads, narrower residual and MLP
        vision = dict(vision_hidden=64, vision_intermediate=128, vision_heads=2)
        hidden, inter = _round(t["hidden_size"] * scale, 128), _round(t["intermediate_size"] * scale, 128)
        kv = max(1, round(t["num_key_value_heads"] * scale))
        heads = kv * (t["num_attention_heads"] // t["num_key_value_heads"])
        lk = max(1, round(t["linear_num_key_heads"] * scale))
        lv = lk * (t["linear_num_value_heads"] // t["linear_num_key_heads"])
    return TinyDims(
        hidden=hidden,
        intermediate=inter,
        layers=layers,
        full_attention_interval=t["full_attention_interval"],
        heads=heads,
        kv_heads=kv,
        head_dim=t["head_dim"],
        linear_key_heads=lk,
        linear_value_heads=lv,
        linear_head_dim=t["linear_key_head_dim"],
        conv_kernel=t["linear_conv_kernel_dim"],
        vocab=vocab or t["vocab_size"],
        vision_depth=1,
        vision_positions=v["num_position_embeddings"],
        patch_size=v["patch_size"],
        temporal_patch_size=v["temporal_patch_size"],
        spatial_merge_size=v["spatial_merge_size"],
        **vision,
    )


def bench_config(ref: dict[str, Any], d: TinyDims) -> dict[str, Any]:
    """config.json: the reference config with `d`'s sizes and the tiny tokenizer's special-token ids."""
    ids = tiny_tokenizer.token_ids()
    cfg = copy.deepcopy(ref)
    cfg.update(
        {
            "dtype": "bfloat16",
            "torch_dtype": "bfloat16",
            "image_token_id": ids["<|image_pad|>"],
            "video_token_id": ids["<|video_pad|>"],
            "vision_start_token_id": ids["<|vision_start|>"],
            "vision_end_token_id": ids["<|vision_end|>"],
        }
    )
    t = cfg["text_config"]
    t.update(
        {
            "dtype": "bfloat16",
            "eos_token_id": ids["<|endoftext|>"],
            "hidden_size": d.hidden,
            "intermediate_size": d.intermediate,
            "num_hidden_layers": d.layers,
            "layer_types": None,
            "num_attention_heads": d.heads,
            "num_key_value_heads": d.kv_heads,
            "head_dim": d.head_dim,
            "linear_num_key_heads": d.linear_key_heads,
            "linear_num_value_heads": d.linear_value_heads,
            "vocab_size": d.vocab,
        }
    )
    cfg["vision_config"].update(
        {
            "depth": d.vision_depth,
            "hidden_size": d.vision_hidden,
            "intermediate_size": d.vision_intermediate,
            "num_heads": d.vision_heads,
            "out_hidden_size": d.hidden,
        }
    )
    return cfg


@dataclass(frozen=True)
class GeneratedTensor:
    """A tensor drawn on demand (duck-types `tensorfile.RawTensor` for `write_checkpoint_tensors`)."""

    name: str
    shape: tuple[int, ...]
    kind: str
    seed: int
    device: str
    dtype: str = "BF16"

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * 2

    def tensor(self) -> Any:
        import torch

        gen = torch.Generator(device=self.device).manual_seed(tensor_seed(self.seed, self.name))
        if self.kind == "a_log":
            x = torch.empty(self.shape, device=self.device).uniform_(1.0, 16.0, generator=gen).log_()
        else:
            x = torch.randn(self.shape, generator=gen, device=self.device, dtype=torch.float32)
            x.mul_(STD[self.kind])
            if self.kind in ("scale", "dt_bias"):
                x.add_(1.0)
        return x.to(torch.bfloat16)

    def read(self) -> Any:
        import torch

        # a uint8 numpy view of the CPU copy: file.write takes it without another host copy
        return self.tensor().cpu().contiguous().view(torch.uint8).numpy()


def tensor_seed(seed: int, name: str) -> int:
    """Per-tensor seed: independent of write order, so any shard plan gives the same values."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "little") >> 1


def tensor_plan(d: TinyDims, seed: int, device: str) -> dict[str, GeneratedTensor]:
    """Every tensor of the checkpoint (language model, lm_head, vision tower, 15 mtp.*)."""
    specs: list[TensorSpec] = body_specs(d) + mtp_specs(d)
    return {s.name: GeneratedTensor(s.name, s.shape, s.kind, seed, device) for s in specs}


def build_checkpoint(
    out_dir: Path, ref: dict[str, Any], d: TinyDims, *, seed: int = 0, device: str = "cpu"
) -> dict[str, Any]:
    """Write the checkpoint into `out_dir` (created; files replaced); return a description."""
    from qwenquant.atomic import atomic_write_bytes, pretty_json
    from qwenquant.checkpoint.tensorfile import write_checkpoint_tensors

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = tensor_plan(d, seed, device)
    mtp = {n: MTP_SHARD for n in tensors if n.startswith("mtp.")}
    weight_map = write_checkpoint_tensors(out_dir, tensors, MAX_SHARD_BYTES, separate=mtp)
    files = {
        "config.json": bench_config(ref, d),
        "generation_config.json": generation_config(),
        "preprocessor_config.json": preprocessor_config(d),
        "video_preprocessor_config.json": video_preprocessor_config(d),
        "tokenizer_config.json": tiny_tokenizer.tokenizer_config(),
    }
    for name, obj in files.items():
        atomic_write_bytes(out_dir / name, pretty_json(obj))
    atomic_write_bytes(out_dir / "tokenizer.json", tiny_tokenizer.tokenizer_json().encode())
    total = sum(t.nbytes for t in tensors.values())
    return {
        "dims": d.__dict__ | {"layer_types": d.layer_types()},
        "seed": seed,
        "device": device,
        "tensors": len(tensors),
        "bytes": total,
        "shards": sorted(set(weight_map.values())),
        "mtp_bytes": sum(tensors[n].nbytes for n in mtp),
    }
