"""Memory budget for serving: weights + KV cache + GDN state + activations against the device.

Pure functions on a ModelShape, a WeightBreakdown and a profile. How vLLM (0.26 .. 0.33) sizes
the caches, read in vLLM's source (vllm-project/vllm, main in 2026), and what is assumed here:

- Full-attention KV per token and layer = 2 (K, V) x kv_heads x head_dim x dtype bytes (auto =
  bf16, fp8 = 1 B), for the target's full-attention layers plus the MTP drafter's own attention
  layer when MTP is on (the drafter's layers get KV cache specs like the target's).
- GDN state per layer and slot = conv state conv_dim x (kernel - 1 + num_spec) in the model dtype
  + SSM state v_heads x v_dim x k_dim in the ssm cache dtype
  (model_executor/layers/mamba/mamba_utils.py `gated_delta_net_state_shape`,
  `gated_delta_net_state_dtype`; the conv state grows by one column per speculative token).
  `--mamba-ssm-cache-dtype auto` is taken as the config's `mamba_ssm_dtype` (float32 on the 27B).
- Slots per sequence (MambaSpec.num_speculative_blocks = num_speculative_tokens,
  mamba/abstract.py; v1/core/single_type_kv_cache_manager.py MambaManager): mode none pads a
  request by num_spec blocks -> 1 + num_spec; mode align allocates 1 + num_spec at the first
  prefill and one more running-state block per step before the block from two steps back is
  freed -> 2 + num_spec at peak (assumed: the budget uses the peak).
- Hybrid paging (model_executor/models/config.py HybridAttentionMambaModelConfig): the attention
  block is enlarged to 16 * cdiv(gdn_page, 16 * attn_bytes_per_token) tokens so an attention
  page >= one layer's GDN state, and the GDN page is padded to it. Layers are grouped
  (v1/core/kv_cache_utils.py `_get_kv_cache_groups_uniform_page_size`) in groups of
  min(#attention, #gdn) layers (max when max < 1.5 x min); a type's last group is padded; one
  pool block costs group_size x page bytes and each group holds its own blocks.
- vLLM refuses to start unless one max_model_len sequence fits; more sequences only set the
  concurrency (it preempts beyond), so "fits" is one sequence and concurrency is reported.
- Activations: what vLLM reserves for them is the peak of its profiling run, and vLLM sizes the KV cache from it.
  Measured on CUDA vLLM 0.26 with the 64-layer 27B artifact (data/vllm_kv_measured.json, plan/measured.py): what
  vLLM leaves for the KV cache is the budget less the weights less a near-constant 3.34-3.39 GiB, at 512- and
  2048-token chunks, with and without MTP (its torch peak alone: 2.58 GiB at 2048 with MTP, 2.48 at 512, 2.47 at
  2048 without; the rest is non-torch memory, CUDA graphs and vLLM's weights above this module's tensor bytes). So
  the profiled activation is modelled as a constant: one bf16 head matrix (vocab x hidden x 2 B, 2.37 GiB; which
  tensor it is was not found) + PROFILED_EXTRA_BYTES, the least-squares fit over those starts (residuals -0.1% to
  +0.8% of the KV cache; tests/unit/test_plan_measured.py refits it). Lowering the chunk therefore frees nothing
  under vLLM's profiler. The fp32 logits of a chunk (tokens x vocab x 4 B; docs/known-issues.md#logits-memory) do
  not show in that peak. A served request stays below it (the 512-token setting served a 200,000-token context in
  22.18 GiB of the 24), so a profile with `kv_cache_from_plan` gives vLLM the plan's KV cache
  (--kv-cache-memory-bytes: no profiling run sizes it) and counts the served peak instead, bounded above by the
  fp32 logits of one chunk + the MLP.
- Runtime inside the budget (vLLM counts it before the KV cache): 0.64 GiB of overhead + 0.12 GiB of CUDA graphs
  unless --enforce-eager. Measured (same runs): beyond this module's weights (tensor bytes) and activations, +0.36
  to +0.39 GiB at weight loading and 0.25-0.26 GiB of non-torch memory, and 0.05-0.13 GiB of CUDA graphs (the fit
  above absorbs what these do not cover). The CUDA context itself is not in vLLM's budget (it is allocated before vLLM
  takes its free-memory snapshot). Not measured on a 3090.
- The MTP draft head's weights are loaded only when the profile drafts (speculative tokens > 0):
  vLLM loaded 0.76 GiB less for the batch profile (no MTP) than for single-user.
- CPU: the cache pool is VLLM_CPU_KVCACHE_SPACE GiB; weights and activations live outside it;
  the CPU attention block is aligned to 128 tokens (not 16). Checked against vllm-cpu 0.32 on
  the tiny model, 1 GiB, 2048 tokens: single-user "Maximum concurrency ... 341.33x" = 8192
  blocks / 24 per request; batch (fp8, align) "1170.29x" = 16384 blocks / 14 per request.

Tensor parallelism of size tp (`tp` arguments; 1 is one GPU and changes nothing): every figure
is per GPU, and vLLM sizes the cache pool from each GPU's own free memory.
- KV per token and layer uses max(1, kv_heads // tp) heads (models/qwen3_next.py
  Qwen3NextAttention: KV heads split, replicated when fewer than tp).
- GDN state: conv_dim / tp channels and v_heads / tp SSM heads
  (mamba_utils.py `gated_delta_net_state_shape(tp_world_size, ...)`); the paging rules above
  then run on these per-GPU page sizes.
- Activations: the logits term is NOT divided: ParallelLMHead computes vocab / tp logits per
  GPU, but LogitsProcessor all-gathers them (layers/logits_processor.py `_gather_logits`,
  `use_all_gather()` is True on CUDA), so every GPU holds the full-vocabulary logits (assumed
  at the same fp32 peak as on one GPU: an upper bound). The MLP gate/up output is split
  (MergedColumnParallelLinear: intermediate / tp columns per GPU).
- Runtime per GPU: the same estimate as on one GPU; NCCL buffers are assumed to fit in it (not
  measured: a two-GPU server did not start on the machine tried, see docs/known-issues.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from qwenquant.plan.weights import ModelShape, WeightBreakdown

GiB = 1024**3
MiB = 1024**2
RUNTIME_OVERHEAD_BYTES = int(0.64 * GiB)
# vLLM's profiling peak beyond a head-sized bf16 matrix: the least-squares fit to vLLM 0.26's logged KV cache on
# the measured starts (plan/measured.py; tests/unit/test_plan_measured.py refits it and fails when it moves)
PROFILED_EXTRA_BYTES = int(0.2334 * GiB)
CUDA_GRAPH_BYTES = int(0.12 * GiB)
_DTYPE_BYTES = {
    "bfloat16": 2,
    "float16": 2,
    "half": 2,
    "float32": 4,
    "float": 4,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "fp8_inc": 1,
}


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def dtype_bytes(name: str | None, auto: int) -> int:
    """Bytes per element of a cache dtype name; `auto` (or None) means `auto` bytes."""
    if name in (None, "auto"):
        return auto
    if name not in _DTYPE_BYTES:
        raise ValueError(f"unknown cache dtype {name!r}")
    return _DTYPE_BYTES[name]


@dataclass(frozen=True)
class CacheSettings:
    """The profile settings the caches depend on."""

    kv_cache_dtype: str = "auto"
    mamba_ssm_cache_dtype: str = "auto"
    mamba_cache_mode: str = "none"  # what vLLM will use: none | align | all
    num_speculative_tokens: int = 0  # 0: no MTP
    model_dtype_bytes: int = 2  # bf16
    block_align: int = 16  # attention block alignment: 16 on CUDA (FlashAttention), 128 on CPU


@dataclass(frozen=True)
class CacheModel:
    """How vLLM lays out KV cache and GDN state for one model + settings."""

    n_attn_layers: int
    kv_bytes_per_token_layer: int
    n_linear_layers: int
    conv_state_bytes: int
    ssm_state_bytes: int
    slots_per_seq: int
    block_tokens: int
    page_bytes: int
    group_size: int
    attn_groups: int
    gdn_groups: int

    @property
    def kv_bytes_per_token(self) -> int:
        """Full-attention KV bytes per token over all attention layers (target + MTP)."""
        return self.n_attn_layers * self.kv_bytes_per_token_layer

    @property
    def gdn_state_bytes_per_slot(self) -> int:
        return self.n_linear_layers * (self.conv_state_bytes + self.ssm_state_bytes)

    @property
    def gdn_state_bytes_per_seq(self) -> int:
        """Unpadded GDN state one sequence holds: every linear layer x its slots."""
        return self.gdn_state_bytes_per_slot * self.slots_per_seq

    @property
    def block_bytes(self) -> int:
        return self.group_size * self.page_bytes

    def seq_blocks(self, max_model_len: int) -> int:
        return self.attn_groups * cdiv(max_model_len, self.block_tokens) + self.gdn_groups * self.slots_per_seq

    def seq_bytes(self, max_model_len: int) -> int:
        """Bytes of the cache pool one sequence of `max_model_len` tokens occupies (paged, padded)."""
        return self.seq_blocks(max_model_len) * self.block_bytes

    def usable_blocks(self, available: int) -> int:
        """Pool blocks a sequence can get from `available` bytes: vLLM's BlockPool keeps the first block as its
        null block (v1/core/block_pool.py). vLLM 0.26's own fit and start check did not subtract it, 0.32's do
        (docs/known-issues.md#autofit-full-prompt, tests/integration/test_plan_cache_vllm.py)."""
        return max(0, available // self.block_bytes - 1)

    def max_len_for(self, available: int, num_seqs: int) -> int:
        """Largest max_model_len (in whole blocks) such that `num_seqs` full sequences fit."""
        per_seq_blocks = self.usable_blocks(available) // num_seqs
        attn_blocks = (per_seq_blocks - self.gdn_groups * self.slots_per_seq) // self.attn_groups
        return max(0, attn_blocks * self.block_tokens)


def cache_model(s: ModelShape, c: CacheSettings, tp: int = 1) -> CacheModel:
    """The cache layout vLLM builds for this model and these settings, on each of `tp` GPUs."""
    kv_heads = max(1, s.num_kv_heads // tp)
    kv_tok = 2 * kv_heads * s.head_dim * dtype_bytes(c.kv_cache_dtype, c.model_dtype_bytes)
    n_attn = s.n_full + (s.mtp_layers if c.num_speculative_tokens else 0)
    ssm_auto = dtype_bytes(s.mamba_ssm_dtype, c.model_dtype_bytes) if s.mamba_ssm_dtype else c.model_dtype_bytes
    conv = s.conv_dim // tp * (s.conv_kernel - 1 + c.num_speculative_tokens) * c.model_dtype_bytes
    ssm = s.lin_num_v_heads // tp * s.lin_v_dim * s.lin_k_dim * dtype_bytes(c.mamba_ssm_cache_dtype, ssm_auto)
    slots = 1 + c.num_speculative_tokens + (1 if c.mamba_cache_mode == "align" else 0)
    mamba_page = conv + ssm
    block = c.block_align * cdiv(mamba_page, c.block_align * kv_tok)
    counts = [n for n in (n_attn, s.n_linear) if n]
    lo, hi = min(counts), max(counts)
    group = hi if hi < 1.5 * lo else lo
    return CacheModel(
        n_attn_layers=n_attn,
        kv_bytes_per_token_layer=kv_tok,
        n_linear_layers=s.n_linear,
        conv_state_bytes=conv,
        ssm_state_bytes=ssm,
        slots_per_seq=slots,
        block_tokens=block,
        page_bytes=block * kv_tok,
        group_size=group,
        attn_groups=cdiv(n_attn, group),
        gdn_groups=cdiv(s.n_linear, group),
    )


def activation_bytes(
    s: ModelShape,
    max_num_batched_tokens: int,
    tp: int = 1,
    logits: bool = True,
    *,
    profiled: bool = False,
) -> int:
    """Peak activation per GPU. `profiled`: what vLLM's profiling run reserves (the module docstring): a
    head-sized bf16 transient on the GPU that holds the lm_head (`logits`) + a constant fitted to vLLM's logged KV
    cache (PROFILED_EXTRA_BYTES), whatever the chunk and whether the profile drafts. Otherwise the served peak,
    bounded above: fp32 logits of a chunk over the whole vocabulary (all-gathered under tensor parallelism) + the
    MLP gate/up output (bf16)."""
    if profiled:
        return (s.vocab * s.hidden * 2 if logits else 0) + PROFILED_EXTRA_BYTES
    mlp = max_num_batched_tokens * 2 * (s.intermediate // tp) * 2
    return (max_num_batched_tokens * s.vocab * 4 if logits else 0) + mlp


def activation_slope(s: ModelShape, tp: int = 1, logits: bool = True, *, profiled: bool = False) -> int:
    """Bytes of `activation_bytes` per token of max-num-batched-tokens (what lowering the chunk frees)."""
    return activation_bytes(s, 1, tp, logits, profiled=profiled) - activation_bytes(s, 0, tp, logits, profiled=profiled)


@dataclass(frozen=True)
class Budget:
    """Weights, activations and caches against the device; what fits and what to lower."""

    device: str
    total_bytes: int  # GPU memory (cuda) or VLLM_CPU_KVCACHE_SPACE (cpu)
    utilization: float
    weights_bytes: int
    activation_bytes: int
    runtime_bytes: int
    cache: CacheModel
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    tp: int = 1  # tensor-parallel size: every figure is per GPU
    pp: int = 1  # pipeline-parallel size: this budget is one stage's GPU
    stage: int = 0  # which pipeline stage (0 first)
    layers: tuple[int, int] = (0, 0)  # the decoder layers [start, end) the stage holds (pp > 1)
    host_bytes: int = 0  # weights kept in pinned host memory instead (the input embedding table)
    activation_per_token: int = 0  # what one token less of max-num-batched-tokens takes off activation_bytes
    profiled: bool = False  # activation_bytes is vLLM's profiling peak (vLLM sizes the KV cache from it)

    @property
    def budget_bytes(self) -> int:
        return int(self.total_bytes * self.utilization) if self.device == "cuda" else self.total_bytes

    @property
    def cache_available(self) -> int:
        """Bytes left for KV cache + GDN state."""
        if self.device == "cpu":  # weights and activations live outside VLLM_CPU_KVCACHE_SPACE
            return self.total_bytes
        return self.budget_bytes - self.weights_bytes - self.activation_bytes - self.runtime_bytes

    @property
    def seq_bytes(self) -> int:
        return self.cache.seq_bytes(self.max_model_len)

    @property
    def fits(self) -> bool:
        """vLLM's own start-up rule (one sequence of max_model_len must fit in the cache), counted in the blocks a
        sequence can get."""
        return self.cache.usable_blocks(self.cache_available) >= self.cache.seq_blocks(self.max_model_len)

    @property
    def concurrency(self) -> int:
        """How many max_model_len sequences fit at once."""
        return self.cache.usable_blocks(self.cache_available) // self.cache.seq_blocks(self.max_model_len)

    @property
    def fits_all_seqs(self) -> bool:
        return self.concurrency >= self.max_num_seqs

    def largest_len(self, num_seqs: int = 1) -> int:
        return min(self.cache.max_len_for(max(0, self.cache_available), num_seqs), 1 << 30)

    def shortfall_message(self) -> str:
        """Which setting to lower and by how much (only meaningful when not `fits`)."""
        avail = self.cache_available
        head = (
            f"max-model-len {self.max_model_len} needs {gib(self.seq_bytes)} for KV cache and GDN state, "
            f"{gib(max(avail, 0))} is left"
        )
        if self.device == "cuda":
            head += (
                f" (budget {gib(self.budget_bytes)} = {gib(self.total_bytes)} x {self.utilization:g}, minus "
                f"weights {gib(self.weights_bytes)}, activations {gib(self.activation_bytes)}, "
                f"runtime {gib(self.runtime_bytes)})"
            )
        else:
            head += " (VLLM_CPU_KVCACHE_SPACE)"
        fixes = []
        best = nice_len(self.largest_len(1))
        if best >= self.cache.block_tokens:
            fixes.append(f"lower --max-model-len to {best}")
        if self.device == "cuda":
            need = self.seq_bytes - avail
            per_tok = self.activation_per_token
            tokens = self.max_num_batched_tokens - cdiv(need, per_tok) if per_tok else 0
            if tokens >= 256:
                tokens = tokens // 256 * 256
                fixes.append(
                    f"lower --max-num-batched-tokens to {tokens} (frees "
                    f"{gib((self.max_num_batched_tokens - tokens) * per_tok)})"
                )
            room = self.weights_bytes + self.activation_bytes + self.runtime_bytes + self.seq_bytes
            util = room / self.total_bytes
            if util <= 0.98:
                fixes.append(f"raise --gpu-memory-utilization to {math.ceil(util * 100) / 100:.2f}")
        else:
            fixes.append(f"set VLLM_CPU_KVCACHE_SPACE to {cdiv(self.seq_bytes, GiB)} (GiB)")
        if not fixes:
            fixes.append("use a device with more memory")
        return head + ": " + ", or ".join(fixes)

    def concurrency_message(self) -> str:
        """When max_num_seqs full-length sequences do not all fit (vLLM starts, then preempts)."""
        n = self.concurrency
        keep = nice_len(self.largest_len(self.max_num_seqs))
        msg = (
            f"max-num-seqs {self.max_num_seqs} at max-model-len {self.max_model_len} needs "
            f"{gib(self.seq_bytes * self.max_num_seqs)}, {gib(max(self.cache_available, 0))} is left: at most "
            f"{n} full-length sequences run at once (lower --max-num-seqs to {n}"
        )
        if keep >= self.cache.block_tokens:
            msg += f", or --max-model-len to {keep} to keep {self.max_num_seqs}"
        return msg + ")"


def nice_len(n: int) -> int:
    """Round a token count down to a multiple of 1024 (256 below 4096) for suggestions."""
    step = 1024 if n >= 4096 else 256
    return n // step * step


def gib(n: int) -> str:
    """A size for a line: GiB with 2 decimals, MiB below 0.01 GiB (never "0.00 GiB")."""
    return f"{n / GiB:.2f} GiB" if abs(n) >= GiB / 100 else f"{n / 2**20:.2f} MiB"


def make_budget(
    s: ModelShape,
    weights: WeightBreakdown,
    cache: CacheSettings,
    *,
    device: str,
    total_bytes: int,
    utilization: float,
    max_model_len: int,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    enforce_eager: bool = False,
    include_vision: bool = False,
    tp: int = 1,
    host_embeddings: bool = False,
    kv_cache_from_plan: bool = False,
) -> Budget:
    """Assemble a Budget; `total_bytes` is GPU memory (cuda, per GPU) or the CPU KV cache space (cpu).
    With `tp` > 1, `weights` must already be per GPU (weights_from_config/_tensors with tp). `host_embeddings`:
    the input embedding table lives in pinned host memory (scripts/vllm-host-embeddings/plugin), not on the GPU."""
    runtime = 0
    if device == "cuda":
        runtime = RUNTIME_OVERHEAD_BYTES + (0 if enforce_eager else CUDA_GRAPH_BYTES)
    profiled = device == "cuda" and not kv_cache_from_plan
    return Budget(
        device=device,
        total_bytes=total_bytes,
        utilization=utilization,
        weights_bytes=weights.loaded(include_vision, include_mtp=cache.num_speculative_tokens > 0)
        - (weights.bytes.get("embeddings", 0) if host_embeddings else 0),
        host_bytes=weights.bytes.get("embeddings", 0) if host_embeddings else 0,
        activation_bytes=activation_bytes(s, max_num_batched_tokens, tp, profiled=profiled),
        activation_per_token=activation_slope(s, tp, profiled=profiled),
        profiled=profiled,
        runtime_bytes=runtime,
        cache=cache_model(s, cache, tp),
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        tp=tp,
    )
