"""Long windows in `qwenquant eval offline`: what bounds a window's length, the text that holds one, and
what one window costs in memory through the layer-streamed forward.

A window is limited by the model's positions (`max_position_embeddings`, 262,144 on Qwen3.8-27B; longer is
refused) and by the text it is cut from (the one short-text rule of texts.py). Nothing else: the
streamed forward keeps each window's hidden states [L, H] (float32) on the host between layers and moves
one window at a time to the device, a decoder layer's MLP runs over `MLP_CHUNK` positions at a time,
attention is torch's scaled_dot_product_attention with its causal flag (no [L, L] mask) and the gated
delta rule runs in transformers' chunks of 64; the logits, KL and MTP drafts are computed
`POSITION_CHUNK` positions at a time.

The pinned depth text (data/depthtext/, the text of `bench depth`, sha256-checked) is the text set
`depth`: 82,171 tokens with the tiny reference's tokenizer (20 windows of 4096). For the 27B's 128K
windows a longer text of the user's (`--text FILE`) is needed: a window of the depth text repeated would
measure copying, not depth.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qwenquant.errors import UsageError

if TYPE_CHECKING:
    from qwenquant.evaluate.reportparts import TextSource

DEPTH_TEXT_SET = "depth"
POSITION_CHUNK = 256  # positions whose logits exist at once in offline.py (the default window: one chunk)
MLP_CHUNK = 2048  # positions per MLP call in the streamed forward (a per-token map: chunking is exact)
GIB = 2**30


def depth_text() -> tuple[str, TextSource]:
    """(the pinned depth text, what the report records of it); refused when its bytes are not the pinned ones."""
    from qwenquant.depthtext import read_pinned
    from qwenquant.evaluate.reportparts import TextSource

    p = read_pinned(UsageError, "reinstall qwenquant (the shipped text was changed)")
    return p.text, TextSource(
        text=DEPTH_TEXT_SET,
        text_set=DEPTH_TEXT_SET,
        file=f"qwenquant/data/depthtext/{p.file}",
        sha256=p.sha256,
        license=p.license,
    )


def max_positions(folder: Path) -> int | None:
    """The text config's max_position_embeddings of the checkpoint in `folder` (None when it has none)."""
    from qwenquant.checkpoint.config import read_config, text_config

    value = text_config(read_config(folder)).get("max_position_embeddings")
    return int(value) if value else None


def check_window_len(reference: Path, window_len: int) -> None:
    """Refuse (exit 2) a window longer than the reference has positions for."""
    limit = max_positions(reference)
    if limit is not None and window_len > limit:
        raise UsageError(
            f"--window-len {window_len} is longer than the model's max_position_embeddings ({limit}, "
            f"{Path(reference) / 'config.json'})",
            hint=f"use --window-len {limit} or less: the model has no positions beyond it",
        )


def chunk_positions(forward: Callable[[Any], Any], chunk: int = MLP_CHUNK) -> Callable[[Any], Any]:
    """`forward` of a per-position map ([B, L, H] -> [B, L, H']) run `chunk` positions at a time (exact)."""

    def chunked(x: Any) -> Any:
        import torch

        if x.shape[1] <= chunk:
            return forward(x)
        return torch.cat([forward(x[:, s : s + chunk]) for s in range(0, x.shape[1], chunk)], dim=1)

    return chunked


def _layer_weights(t: dict[str, Any]) -> dict[str, int]:
    """Parameters of one full-attention and one linear-attention (gated delta rule) decoder layer."""
    h, inter = t["hidden_size"], t["intermediate_size"]
    heads, kv, hd = t["num_attention_heads"], t["num_key_value_heads"], t["head_dim"]
    kh, khd, vh, vhd = (
        t["linear_num_key_heads"],
        t["linear_key_head_dim"],
        t["linear_num_value_heads"],
        t["linear_value_head_dim"],
    )
    mlp = 3 * h * inter
    attn = h * (2 * heads * hd + 2 * kv * hd) + heads * hd * h
    gdn = (
        h * (2 * kh * khd + 2 * vh * vhd + 2 * vh)
        + vh * vhd * h
        + (2 * kh * khd + vh * vhd) * t["linear_conv_kernel_dim"]
    )
    return {"full_attention": mlp + attn, "linear_attention": mlp + gdn}


def _per_token_bytes(t: dict[str, Any]) -> dict[str, int]:
    """float32 bytes per position alive at once inside one decoder layer of each type: the layer's input,
    its residual and output ([L, H] three times), the normed input, and the attention's projections."""
    h = t["hidden_size"]
    heads, kv, hd = t["num_attention_heads"], t["num_key_value_heads"], t["head_dim"]
    kh, khd, vh, vhd = (
        t["linear_num_key_heads"],
        t["linear_key_head_dim"],
        t["linear_num_value_heads"],
        t["linear_value_head_dim"],
    )
    attn = 2 * heads * hd + 2 * kv * hd + 2 * heads * hd  # q and gate, k, v, the attention output and its gated copy
    # q, k, v, z before and after the causal conv, the recurrence's q/k/v/decay/beta copies and its output
    gdn = 2 * (2 * kh * khd + 2 * vh * vhd) + 3 * (2 * kh * khd + vh * vhd) + 2 * vh * vhd
    return {"full_attention": 4 * (4 * h + attn), "linear_attention": 4 * (4 * h + gdn)}


def window_memory(text_cfg: dict[str, Any], window_len: int, windows: int, arms: int = 2) -> dict[str, float]:
    """GiB the streamed forward needs for `windows` windows of `window_len` tokens (computed from the config,
    not measured): on the host, every arm's hidden states between layers and the reference's final ones kept
    for the lm_head test; on the device, the largest
    decoder layer in float32 plus one window through it (its MLP in MLP_CHUNK positions), and, at the logit
    stage, the three float32 lm_heads plus a few logit chunks."""
    h, vocab, inter = text_cfg["hidden_size"], text_cfg["vocab_size"], text_cfg["intermediate_size"]
    weights, per_tok = _layer_weights(text_cfg), _per_token_bytes(text_cfg)
    mlp = 4 * min(window_len, MLP_CHUNK) * 3 * inter
    layer = max(4 * weights[k] + window_len * per_tok[k] + mlp for k in weights)
    heads = 3 * 4 * vocab * h + 6 * 4 * POSITION_CHUNK * vocab
    return {
        "host_hidden_gib": (arms + 1) * windows * window_len * h * 4 / GIB,
        "device_layer_gib": layer / GIB,
        "device_heads_gib": heads / GIB,
        "device_peak_gib": max(layer, heads) / GIB,
    }


def memory_line(text_cfg: dict[str, Any], window_len: int, windows: int, arms: int = 2) -> str:
    """One line: what the run needs, computed from the config (logged by eval offline and quoted in the README)."""
    m = window_memory(text_cfg, window_len, windows, arms)
    return (
        f"{windows} x {window_len:,}-token windows, {arms} arms, computed (not measured): host "
        f"{m['host_hidden_gib']:.1f} GiB of hidden states (every arm's, and the reference's for the lm_head test); device peak {m['device_peak_gib']:.1f} GiB "
        f"(one decoder layer with one window {m['device_layer_gib']:.1f} GiB, the three float32 lm_heads "
        f"{m['device_heads_gib']:.1f} GiB)"
    )
