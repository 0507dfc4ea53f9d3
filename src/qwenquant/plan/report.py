"""Text and JSON renderings of a memory plan (`qwenquant plan`, and serve's preflight)."""

from __future__ import annotations

from typing import Any

from qwenquant.plan.budget import Budget, GiB, gib
from qwenquant.plan.transient import Fill, fill, fill_fix
from qwenquant.plan.weights import ModelShape, WeightBreakdown

_LABELS = {
    "embeddings": "embeddings (bf16)",
    "int4_body": "int4 body (packed + bf16 scales)",
    "lm_head": "lm_head",
    "mtp": "MTP draft head",
    "other_bf16": "other bf16 (norms, GDN gates/conv, ...)",
    "vision": "vision tower",
}


def _row(label: str, n: int, note: str = "") -> str:
    return f"  {label:<42} {n:>16,} B  {n / GiB:8.3f} GiB{('  ' + note) if note else ''}"


def weights_lines(w: WeightBreakdown, include_vision: bool) -> list[str]:
    lines = [f"weights (from the {w.source})"]
    for k, n in w.bytes.items():
        label = _LABELS[k]
        if k == "lm_head":
            label = "int4 lm_head (packed + bf16 scales)" if w.lm_head_quantized else "lm_head (bf16)"
        note = "not loaded (text-only / --language-model-only)" if k == "vision" and not include_vision else ""
        lines.append(_row(label, n, note))
    lines.append(_row("total loaded", w.loaded(include_vision)))
    lines += [f"  note: {n}" for n in w.notes]
    return lines


def first_reason(b: Budget) -> str:
    """The first reason a budget does not fit, biggest cause first (weights, then fixed costs, then cache)."""
    fixed = b.weights_bytes + b.activation_bytes + b.runtime_bytes
    if b.device == "cuda" and b.weights_bytes > b.budget_bytes:
        return (
            f"the weights alone ({gib(b.weights_bytes)}) exceed the {gib(b.budget_bytes)} budget "
            f"({gib(b.total_bytes)} x {b.utilization:g})"
        )
    if b.device == "cuda" and fixed >= b.budget_bytes:
        return (
            f"weights {gib(b.weights_bytes)} + activations {gib(b.activation_bytes)} + runtime "
            f"{gib(b.runtime_bytes)} leave nothing of the {gib(b.budget_bytes)} budget for the KV cache"
        )
    return b.shortfall_message()


def budget_lines(
    name: str, b: Budget, s: ModelShape, *, refused: str | None = None, positions: int | None = None
) -> list[str]:
    """The text block of one profile. `refused`: why serve refuses the profile whatever the memory (the
    block then never says it fits); `positions`: the model's max_position_embeddings (a larger length
    is said to be above it)."""
    lines = [
        f"profile {name}: max-model-len {b.max_model_len}, max-num-seqs {b.max_num_seqs}, "
        f"max-num-batched-tokens {b.max_num_batched_tokens}, device {b.device}"
        + (f", tensor parallel {b.tp} (per GPU)" if b.tp > 1 else "")
        + (f", {stage_name(b)}" if b.pp > 1 else "")
    ]
    lines += _cache_lines(b, s)
    if b.device == "cuda":
        lines += _gpu_lines(b, s)
    lines.append(_row("left for KV cache + GDN state", max(b.cache_available, 0)))
    if not b.fits:
        lines.append(f"  DOES NOT FIT: {first_reason(b)}")
        if b.largest_len(1) == 0:
            return lines
    elif refused:
        lines.append(
            f"  memory for {b.concurrency} full-length sequence(s) at once, but serve refuses the profile: {refused}"
        )
    else:
        lines.append(f"  fits: {b.concurrency} full-length sequence(s) at once (max-num-seqs {b.max_num_seqs})")
    lines.append(largest_line(b, positions))
    if not b.fits:
        lines.append("  " + b.shortfall_message())
    elif not b.fits_all_seqs:
        lines.append("  " + b.concurrency_message())
    f = fill(b, s)
    if f is not None:
        lines += fill_lines(b, f)
    return lines


def _cache_lines(b: Budget, s: ModelShape) -> list[str]:
    """The KV cache and GDN state per token and per sequence, and vLLM's paging of them."""
    c = b.cache
    full = _full_layers(b, s)
    mtp = c.n_attn_layers - full
    return [
        _row(
            "KV cache per token",
            c.kv_bytes_per_token,
            f"{c.n_attn_layers} layers ({full} full-attention + {mtp} MTP) x {c.kv_bytes_per_token_layer:,} B",
        ),
        _row(
            "GDN state per sequence",
            c.gdn_state_bytes_per_seq,
            f"{c.n_linear_layers} layers x ({c.conv_state_bytes:,} conv + {c.ssm_state_bytes:,} ssm) B "
            f"x {c.slots_per_seq} slots",
        ),
        f"  paging: {c.block_tokens}-token blocks, {c.page_bytes:,} B pages, {c.attn_groups} attention + "
        f"{c.gdn_groups} GDN groups of {c.group_size} layers"
        + (" of this stage (the most it holds in one group)" if b.pp > 1 else ""),
        _row("one max-model-len sequence (paged)", b.seq_bytes),
    ]


def _full_layers(b: Budget, s: ModelShape) -> int:
    """Full-attention decoder layers on this budget's GPU (this stage's with pp > 1)."""
    return sum(t == "full_attention" for t in s.layer_types[b.layers[0] : b.layers[1]]) if b.pp > 1 else s.n_full


def _gpu_lines(b: Budget, s: ModelShape) -> list[str]:
    """What takes the GPU budget before the KV cache: weights (and the table kept on the host), activations,
    runtime; the budget and the memory formula."""
    drafts = b.cache.n_attn_layers > _full_layers(b, s)  # the MTP layer's KV is counted only when it drafts
    note = "  MTP head not loaded: this profile does not draft" if s.mtp_layers and not drafts else ""
    lines = [_row("weights loaded", b.weights_bytes) + note]
    if b.host_bytes:
        lines.append(_row("input embeddings in pinned host memory", b.host_bytes, "host embeddings: off the GPU"))
    act = "activations (vLLM's profiling peak)" if b.profiled else "activations (fp32 logits + MLP)"
    lines += [
        _row(act, b.activation_bytes),
        _row("runtime overhead + CUDA graphs (measured)", b.runtime_bytes),
        _row(f"budget ({gib(b.total_bytes)} x {b.utilization:g})", b.budget_bytes),
        formula_line(b),
    ]
    return lines


def formula_bytes(b: Budget) -> tuple[int, int]:
    """(fixed bytes, bytes per token) of one sequence on this GPU: weights, activations, runtime, the sequence's
    GDN state and vLLM's null block, then the KV cache per token of context (paged: a context costs whole blocks)."""
    c = b.cache
    fixed = (
        b.weights_bytes + b.activation_bytes + b.runtime_bytes + (c.gdn_groups * c.slots_per_seq + 1) * c.block_bytes
    )
    return fixed, c.attn_groups * c.block_bytes // c.block_tokens


def formula_line(b: Budget) -> str:
    """The profile's memory as a formula a user can pick a context with before booting."""
    fixed, per_token = formula_bytes(b)
    return (
        f"  memory formula: {gib(fixed)} + {per_token:,} B per token of context (in "
        f"{b.cache.block_tokens}-token blocks), within vLLM's budget of {gib(b.budget_bytes)}"
    )


def largest_line(b: Budget, positions: int | None) -> str:
    """The largest max-model-len the cache holds, for one sequence and for max-num-seqs: the figures
    `--json` gives (largest_len_1, largest_len_all); one above the model's positions says so."""
    one, every = b.largest_len(1), b.largest_len(b.max_num_seqs)
    line = f"  largest max-model-len: {one:,} for 1 sequence"
    if b.max_num_seqs > 1:
        line += f", {every:,} for {b.max_num_seqs} sequences"
    if positions is not None and one > positions:
        line += (
            f" (the cache's figure; above the model's {positions:,} positions: serve takes at most "
            f"{positions:,} unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1)"
        )
    return line


def stage_name(b: Budget) -> str:
    return f"pipeline stage {b.stage} of {b.pp} (decoder layers {b.layers[0]}-{b.layers[1] - 1})"


def pipeline_lines(name: str, stages: list[Budget], s: ModelShape, *, refused: str | None = None) -> list[str]:
    """What a pipeline-parallel server gets: vLLM gives every stage the block count of the stage
    with the fewest, so the smallest stage's figures are the server's (`refused`: as budget_lines)."""
    from qwenquant.plan.pipeline import binding

    b = binding(stages)
    head = f"profile {name} over {b.pp} pipeline stages: "
    if not b.fits:
        return [head + f"DOES NOT FIT on {stage_name(b)}: {first_reason(b)}"]
    if refused:
        return [head + f"DOES NOT FIT: {refused}, which serve refuses whatever the memory"]
    line = (
        head + f"fits on every stage; {stage_name(b)} has the fewest cache blocks, so {b.concurrency} "
        f"full-length sequence(s) at once and a largest max-model-len of {b.largest_len(1):,}"
    )
    fills = [f for f in (fill(x, s) for x in stages) if f is not None]
    if fills:
        line += (
            f"; largest single prompt that fills {min(f.largest_prompt for f in fills):,} tokens, largest burst "
            f"{min(f.largest_burst for f in fills)} new prompt(s) in one step"
        )
    return [line]


def fill_lines(b: Budget, f: Fill) -> list[str]:
    """The GDN prefill transient against the memory outside vLLM's budget: the largest prompt and burst."""
    lines = [
        _row(f"GDN prefill transient, {f.chunk_tokens}-token chunk", f.chunk_bytes, "not in vLLM's budget"),
        _row(f"  ... {f.burst_seqs} new prompts in one step", f.burst_bytes),
        _row("outside vLLM's budget, less the CUDA context", max(f.headroom, 0)),
    ]
    lines.append(
        f"  largest single prompt that fills: {f.largest_prompt:,} tokens; largest burst: "
        f"{f.largest_burst} new prompt(s) in one step (max-num-seqs {b.max_num_seqs})"
    )
    if not f.holds:
        what = (
            f"a {f.chunk_tokens}-token prefill chunk needs {gib(f.chunk_bytes)}"
            if not f.chunk_fits
            else f"a burst of {f.burst_seqs} new prompts needs {gib(f.burst_bytes)}"
        )
        lines.append(
            f"  DOES NOT FILL: {what} of GDN transient outside vLLM's budget, {gib(max(f.headroom, 0))} "
            f"is there: {fill_fix(b, f)}"
        )
    return lines


def budget_dict(b: Budget, s: ModelShape | None = None) -> dict[str, Any]:
    """The budget as JSON; with the model's shape, its fill plan too (CUDA: `fill`, else null)."""
    c = b.cache
    f = fill(b, s) if s is not None else None
    extra: dict[str, Any] = (
        {}
        if s is None
        else {
            "fill": None
            if f is None
            else {
                "headroom_bytes": f.headroom,
                "chunk_tokens": f.chunk_tokens,
                "chunk_transient_bytes": f.chunk_bytes,
                "burst_seqs": f.burst_seqs,
                "burst_transient_bytes": f.burst_bytes,
                "largest_prompt": f.largest_prompt,
                "largest_burst": f.largest_burst,
                "holds": f.holds,
            }
        }
    )
    return extra | {
        "device": b.device,
        "total_bytes": b.total_bytes,
        "utilization": b.utilization,
        "budget_bytes": b.budget_bytes,
        "weights_bytes": b.weights_bytes,
        "activation_bytes": b.activation_bytes,
        "runtime_bytes": b.runtime_bytes,
        "kv_bytes_per_token": c.kv_bytes_per_token,
        "host_bytes": b.host_bytes,
        "formula": dict(zip(("fixed_bytes", "bytes_per_token"), formula_bytes(b), strict=True)),
        "gdn_state_bytes_per_seq": c.gdn_state_bytes_per_seq,
        "block_tokens": c.block_tokens,
        "page_bytes": c.page_bytes,
        "seq_bytes": b.seq_bytes,
        "cache_available": b.cache_available,
        "max_model_len": b.max_model_len,
        "max_num_seqs": b.max_num_seqs,
        "fits": b.fits,
        "concurrency": b.concurrency,
        "largest_len_1": b.largest_len(1),
        "largest_len_all": b.largest_len(b.max_num_seqs),
        "tensor_parallel_size": b.tp,
        "pipeline_parallel_size": b.pp,
        "stage": b.stage,
        "layers": list(b.layers) if b.pp > 1 else None,
    }
