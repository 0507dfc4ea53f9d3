"""The Gated DeltaNet prefill transient: the memory vLLM's KV sizing never budgets (pure).

vLLM's memory profiling run does not exercise the GDN layers, so its peak-activation figure, and
with it the KV cache it sizes to `utilization x total`, leaves out the extra memory of one GDN
layer's prefill forward. That transient is allocated beyond vLLM's budget, in what the card has
left outside it: `total - utilization x total - the CUDA context` (the context is allocated before
vLLM's free-memory snapshot, docs/known-issues.md#runtime-budget). A step that does not fit there
runs out of memory although the server booted (public 3090 report: a burst of 64 new prompts needed
about 650 MiB more; 0.95 utilization ran out of memory, 0.94 did not).

One GDN layer's prefill step of T tokens over N new sequences (layers run one after another, so
one layer's transient is the peak), per GPU (heads / tp), bf16 activations:

  per token:    8 x key_dim + 12 x value_dim  (qkvz projection 4 kd + 4 vd, conv'd q|k|v 4 kd + 2 vd,
                core output 2 vd, chunk kernel u and v_new 4 vd, all bf16)
              + 256 x v_heads                  (the chunk's k k^T matrix A, fp32, 64-token chunks)
              + 2 x v_heads x k_dim            (w, bf16)
              + v_heads x k_dim x v_dim / 32   (h: one bf16 state per 64-token chunk)
  per sequence: 10 x v_heads x k_dim x v_dim   (the gathered initial state and the final state,
                fp32, and up to one more chunk state at the sequence boundary)

On the 27B (16 key / 48 value heads of 128): 139,264 B per token (136 KiB; 272 MiB for a
2048-token chunk) and 7.5 MiB per sequence, derived from the kernel's tensor sizes (vLLM's
chunk_gated_delta_rule: chunk_scaled_dot_kkt, solve_tril, recompute_w_u, chunk_gated_delta_rule_fwd_h,
chunk_fwd_o). benchmarks/gdn_transient.py measured 133,892 B per token and 5.2 MiB per sequence with
flash-linear-attention's kernel at the real shape on an H200; TOKEN_SCALE / SEQ_SCALE carry the
measured / derived ratios (tests/unit/test_plan_transient.py pins the resulting figures, so a
change is deliberate). vLLM's own copy of the kernel was not measured.
"""

from __future__ import annotations

from dataclasses import dataclass

from qwenquant.plan.budget import Budget, GiB, cdiv
from qwenquant.plan.weights import ModelShape

# measured / derived: benchmarks/gdn_transient.py --kernel fla on one NVIDIA H200 (benchmarks/RESULTS.md,
# "Serving that fills"): 133,892 B per token (one sequence, 512..8192 tokens) and 5,445,547 B per
# extra sequence of an 8192-token burst, against the derived 139,264 and 7,864,320
TOKEN_SCALE = 133_892 / 139_264
SEQ_SCALE = 5_445_547 / 7_864_320
# The CUDA context outside vLLM's budget (driver, cuBLAS workspaces; lazy module loading). Assumed:
# not measured on a 3090 (an H200's is measured by `ballast.py --probe`, benchmarks/README.md).
CUDA_CONTEXT_BYTES = int(0.5 * GiB)
CHUNK = 64  # the chunk kernel's block of tokens


def gdn_token_bytes(s: ModelShape, tp: int = 1) -> int:
    """Transient bytes per prefill token of one GDN layer (module docstring), on each of `tp` GPUs."""
    hk, hv = s.lin_num_k_heads // tp, s.lin_num_v_heads // tp
    kd, vd = hk * s.lin_k_dim, hv * s.lin_v_dim
    derived = 8 * kd + 12 * vd + 4 * hv * CHUNK + 2 * hv * s.lin_k_dim + 2 * hv * s.lin_k_dim * s.lin_v_dim // CHUNK
    return round(derived * TOKEN_SCALE)


def gdn_seq_bytes(s: ModelShape, tp: int = 1) -> int:
    """Transient bytes per sequence of a prefill step (its recurrent states), on each of `tp` GPUs."""
    return round(10 * (s.lin_num_v_heads // tp) * s.lin_k_dim * s.lin_v_dim * SEQ_SCALE)


def gdn_transient(s: ModelShape, tokens: int, seqs: int = 1, tp: int = 1) -> int:
    """Extra bytes of one GDN layer's prefill step of `tokens` tokens over `seqs` new sequences."""
    if not s.n_linear or tokens <= 0:
        return 0
    return tokens * gdn_token_bytes(s, tp) + max(1, min(seqs, tokens)) * gdn_seq_bytes(s, tp)


@dataclass(frozen=True)
class Fill:
    """Whether a profile's context fills, not only boots: its GDN prefill steps against the headroom."""

    headroom: int  # bytes outside vLLM's budget for the transient (CUDA); < 0 when the budget is over the card
    chunk_tokens: int  # max_num_batched_tokens: the largest prefill step
    chunk_bytes: int  # one sequence's step of chunk_tokens
    burst_seqs: int  # max_num_seqs new prompts in one step
    burst_bytes: int
    largest_prompt: int  # tokens of the largest single prompt that fills (0: none)
    largest_burst: int  # new prompts in one step that fit (0: none)

    @property
    def chunk_fits(self) -> bool:
        return self.chunk_bytes <= self.headroom

    @property
    def burst_fits(self) -> bool:
        return self.burst_bytes <= self.headroom

    @property
    def holds(self) -> bool:
        return self.chunk_fits and self.burst_fits


def fill(b: Budget, s: ModelShape) -> Fill | None:
    """The fill plan of a CUDA budget (None on CPU: weights and activations are outside the KV space there)."""
    if b.device != "cuda":
        return None
    head = b.total_bytes - b.budget_bytes - CUDA_CONTEXT_BYTES
    chunk = b.max_num_batched_tokens
    one = gdn_transient(s, chunk, 1, b.tp)
    burst_n = min(b.max_num_seqs, chunk)
    kv_len = min(b.max_model_len, b.largest_len(1)) if b.fits else 0
    if one <= head:
        prompt = kv_len
    else:  # prompts up to the step that still fits prefill in one step; longer ones run out of memory
        per_tok, per_seq = gdn_token_bytes(s, b.tp), gdn_seq_bytes(s, b.tp)
        prompt = min(kv_len, max(0, (head - per_seq) // per_tok) if per_tok else kv_len)
    bursts = [n for n in range(1, burst_n + 1) if gdn_transient(s, chunk, n, b.tp) <= head]
    return Fill(
        headroom=head,
        chunk_tokens=chunk,
        chunk_bytes=one,
        burst_seqs=burst_n,
        burst_bytes=gdn_transient(s, chunk, burst_n, b.tp),
        largest_prompt=prompt,
        largest_burst=max(bursts, default=0),
    )


def fill_fix(b: Budget, f: Fill) -> str:
    """The settings that make a fill hold: a lower utilization, or a smaller prefill chunk."""
    need = max(f.chunk_bytes, f.burst_bytes)
    util = (b.total_bytes - CUDA_CONTEXT_BYTES - need) / b.total_bytes
    fixes = []
    if util > 0:
        fixes.append(f"lower --gpu-memory-utilization to {int(util * 100) / 100:.2f}")
    if f.chunk_tokens > 256:
        fixes.append(f"or --max-num-batched-tokens to {max(256, cdiv(f.chunk_tokens, 2) // 256 * 256)}")
    return ", ".join(fixes) or "use a GPU with more memory"
