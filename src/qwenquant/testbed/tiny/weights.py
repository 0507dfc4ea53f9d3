"""Every tensor of the tiny checkpoint: names and shapes (pure), and deterministic values.

Tensor kinds and their initial values (drawn from one seeded generator, in name order):
  linear   N(0, 0.02)                       Linear / embedding / conv3d weights, vision biases
  offset   N(0, 0.05)                       Qwen3.5 offset RMSNorm weights, used as x * (1 + w)
  scale    1 + N(0, 0.05)                   plain multiplicative norms (LayerNorm, GDN gated norm)
  bias     N(0, 0.02)                       LayerNorm biases
  conv     N(0, 0.25)                       GDN depthwise conv1d (kernel 4: keeps signal alive)
  a_log    log(U(1, 16))                    GDN decay, as transformers initialises it
  dt_bias  1 + N(0, 0.05)

Constant variant (see `make_constant`): every token predicts token T, through the body and the MTP
head alike, after int4 quantization too.
"""

from __future__ import annotations

import torch

from qwenquant.checkpoint.tensorfile import TensorSpec
from qwenquant.testbed.tiny.config import DIMS, TinyDims

LM = "model.language_model"
VIS = "model.visual"


def _attention(prefix: str, d: TinyDims) -> list[TensorSpec]:
    h, hd = d.hidden, d.head_dim
    return [
        TensorSpec(f"{prefix}.self_attn.q_proj.weight", (2 * d.heads * hd, h), "linear"),  # attn_output_gate
        TensorSpec(f"{prefix}.self_attn.k_proj.weight", (d.kv_heads * hd, h), "linear"),
        TensorSpec(f"{prefix}.self_attn.v_proj.weight", (d.kv_heads * hd, h), "linear"),
        TensorSpec(f"{prefix}.self_attn.o_proj.weight", (h, d.heads * hd), "linear"),
        TensorSpec(f"{prefix}.self_attn.q_norm.weight", (hd,), "offset"),
        TensorSpec(f"{prefix}.self_attn.k_norm.weight", (hd,), "offset"),
    ]


def _gated_deltanet(prefix: str, d: TinyDims) -> list[TensorSpec]:
    h = d.hidden
    key_dim = d.linear_key_heads * d.linear_head_dim
    value_dim = d.linear_value_heads * d.linear_head_dim
    p = f"{prefix}.linear_attn"
    return [
        TensorSpec(f"{p}.A_log", (d.linear_value_heads,), "a_log"),
        TensorSpec(f"{p}.conv1d.weight", (2 * key_dim + value_dim, 1, d.conv_kernel), "conv"),
        TensorSpec(f"{p}.dt_bias", (d.linear_value_heads,), "dt_bias"),
        TensorSpec(f"{p}.in_proj_a.weight", (d.linear_value_heads, h), "linear"),
        TensorSpec(f"{p}.in_proj_b.weight", (d.linear_value_heads, h), "linear"),
        TensorSpec(f"{p}.in_proj_qkv.weight", (2 * key_dim + value_dim, h), "linear"),
        TensorSpec(f"{p}.in_proj_z.weight", (value_dim, h), "linear"),
        TensorSpec(f"{p}.norm.weight", (d.linear_head_dim,), "scale"),
        TensorSpec(f"{p}.out_proj.weight", (h, value_dim), "linear"),
    ]


def _decoder_layer(prefix: str, block: str, d: TinyDims) -> list[TensorSpec]:
    mixer = _attention(prefix, d) if block == "full_attention" else _gated_deltanet(prefix, d)
    h, m = d.hidden, d.intermediate
    return mixer + [
        TensorSpec(f"{prefix}.input_layernorm.weight", (h,), "offset"),
        TensorSpec(f"{prefix}.post_attention_layernorm.weight", (h,), "offset"),
        TensorSpec(f"{prefix}.mlp.gate_proj.weight", (m, h), "linear"),
        TensorSpec(f"{prefix}.mlp.up_proj.weight", (m, h), "linear"),
        TensorSpec(f"{prefix}.mlp.down_proj.weight", (h, m), "linear"),
    ]


def _vision(d: TinyDims) -> list[TensorSpec]:
    v, vm = d.vision_hidden, d.vision_intermediate
    merged = v * d.spatial_merge_size**2
    specs = [
        TensorSpec(
            f"{VIS}.patch_embed.proj.weight", (v, 3, d.temporal_patch_size, d.patch_size, d.patch_size), "linear"
        ),
        TensorSpec(f"{VIS}.patch_embed.proj.bias", (v,), "linear"),
        TensorSpec(f"{VIS}.pos_embed.weight", (d.vision_positions, v), "linear"),
        TensorSpec(f"{VIS}.merger.norm.weight", (v,), "scale"),
        TensorSpec(f"{VIS}.merger.norm.bias", (v,), "bias"),
        TensorSpec(f"{VIS}.merger.linear_fc1.weight", (merged, merged), "linear"),
        TensorSpec(f"{VIS}.merger.linear_fc1.bias", (merged,), "linear"),
        TensorSpec(f"{VIS}.merger.linear_fc2.weight", (d.hidden, merged), "linear"),
        TensorSpec(f"{VIS}.merger.linear_fc2.bias", (d.hidden,), "linear"),
    ]
    for i in range(d.vision_depth):
        b = f"{VIS}.blocks.{i}"
        specs += [
            TensorSpec(f"{b}.norm1.weight", (v,), "scale"),
            TensorSpec(f"{b}.norm1.bias", (v,), "bias"),
            TensorSpec(f"{b}.norm2.weight", (v,), "scale"),
            TensorSpec(f"{b}.norm2.bias", (v,), "bias"),
            TensorSpec(f"{b}.attn.qkv.weight", (3 * v, v), "linear"),
            TensorSpec(f"{b}.attn.qkv.bias", (3 * v,), "linear"),
            TensorSpec(f"{b}.attn.proj.weight", (v, v), "linear"),
            TensorSpec(f"{b}.attn.proj.bias", (v,), "linear"),
            TensorSpec(f"{b}.mlp.linear_fc1.weight", (vm, v), "linear"),
            TensorSpec(f"{b}.mlp.linear_fc1.bias", (vm,), "linear"),
            TensorSpec(f"{b}.mlp.linear_fc2.weight", (v, vm), "linear"),
            TensorSpec(f"{b}.mlp.linear_fc2.bias", (v,), "linear"),
        ]
    return specs


def mtp_specs(d: TinyDims = DIMS) -> list[TensorSpec]:
    """The 15 `mtp.*` tensors of a Qwen3.5 checkpoint (one full-attention MTP layer)."""
    h = d.hidden
    return [
        TensorSpec("mtp.fc.weight", (h, 2 * h), "linear"),
        TensorSpec("mtp.pre_fc_norm_embedding.weight", (h,), "offset"),
        TensorSpec("mtp.pre_fc_norm_hidden.weight", (h,), "offset"),
        TensorSpec("mtp.norm.weight", (h,), "offset"),
        *_decoder_layer("mtp.layers.0", "full_attention", d),
    ]


def body_specs(d: TinyDims = DIMS) -> list[TensorSpec]:
    """Every tensor transformers' Qwen3_5ForConditionalGeneration holds (no mtp.*)."""
    specs = [
        TensorSpec(f"{LM}.embed_tokens.weight", (d.vocab, d.hidden), "linear"),
        TensorSpec(f"{LM}.norm.weight", (d.hidden,), "offset"),
        TensorSpec("lm_head.weight", (d.vocab, d.hidden), "linear"),
    ]
    for i, block in enumerate(d.layer_types()):
        specs += _decoder_layer(f"{LM}.layers.{i}", block, d)
    return specs + _vision(d)


def _draw(spec: TensorSpec, gen: torch.Generator) -> torch.Tensor:
    shape = spec.shape
    if spec.kind == "a_log":
        return torch.log(torch.empty(shape).uniform_(1.0, 16.0, generator=gen))
    std = {"linear": 0.02, "offset": 0.05, "scale": 0.05, "bias": 0.02, "conv": 0.25, "dt_bias": 0.05}[spec.kind]
    values = torch.randn(shape, generator=gen) * std
    return values + 1.0 if spec.kind in ("scale", "dt_bias") else values


def random_tensors(seed: int, d: TinyDims = DIMS) -> dict[str, torch.Tensor]:
    """Float32 values for every tensor, drawn in sorted-name order from one generator seeded `seed`."""
    gen = torch.Generator().manual_seed(seed)
    specs = sorted(body_specs(d) + mtp_specs(d), key=lambda s: s.name)
    return {s.name: _draw(s, gen) for s in specs}


# Constant-variant strengths (per coordinate of the hidden state; see make_constant).
EMBED_SIGNAL = 1.0
EMBED_NOISE = 0.25
HEAD_ROW = 0.5


def make_constant(tensors: dict[str, torch.Tensor], token: int, seed: int, d: TinyDims = DIMS) -> None:
    """Turn random weights (in place) into a model whose target and MTP head always predict `token`.

    Let u be a fixed direction in hidden space with every coordinate +-1 (sign pattern from `seed`).
    1. Every embedding row is u + N(0, 0.25) per coordinate, so the residual stream starts with
       u . x ~ +256 (= hidden) against noise of ~4 along u. The decoder layers keep their small
       random weights; each adds ~0.1-0.3 per coordinate in directions unrelated to u, so after the
       4 layers u . x stays ~ +256 with noise of a few units.
    2. Offset norms are 1 + w with |w| ~ 0.05, so every RMSNorm keeps the sign of each coordinate:
       the final norm output y has u . y ~ +256 as well.
    3. lm_head row T is 0.5 * u; the other rows stay N(0, 0.02). logit_T ~ 0.5 * 256 = 128, any
       other logit ~ N(0, 0.3). Row T has one magnitude, so symmetric int4 represents it exactly
       (q = +-7, scale 0.5/7); the noise rows quantize to noise of the same size.
    4. MTP: its inputs norm(embed(next)) and norm(target hidden) both point along +u by (1, 2).
       mtp.fc gets a rank-one part u (x) [u; u] / 512, which maps the pair to ~ +u (1 per
       coordinate); its random part adds ~0.45 per coordinate elsewhere. The MTP layer's random
       weights are small, and mtp.norm then the shared lm_head give T as in (2, 3). This holds
       whichever hidden state vLLM hands the drafter (pre- or post-final-norm): both point along +u.
    Margins are ~115 logits, so int4 error (a few % per weight) cannot move the argmax: the tests
    check it after round-to-nearest int4 of every Linear (body, lm_head, MTP), and llm-compressor
    GPTQ W4A16 with an int4 lm_head was checked by hand to keep 100% too.
    """
    gen = torch.Generator().manual_seed(seed + 1_000_003)
    h = d.hidden
    u = torch.randint(0, 2, (h,), generator=gen).float() * 2 - 1
    embed = tensors[f"{LM}.embed_tokens.weight"]
    tensors[f"{LM}.embed_tokens.weight"] = EMBED_SIGNAL * u + torch.randn(embed.shape, generator=gen) * EMBED_NOISE
    tensors["lm_head.weight"][token] = HEAD_ROW * u
    # fc @ [e; x] with e ~ x ~ u (rms 1): (u/16) * (u.e + u.x) / 32 = u * (256 + 256) / 512 = u
    tensors["mtp.fc.weight"] = tensors["mtp.fc.weight"] + torch.outer(u, torch.cat([u, u])) / (2 * h)
