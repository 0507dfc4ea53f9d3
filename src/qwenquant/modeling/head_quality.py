"""How much a quantized lm_head changes the next-token distribution, and what the head sees.

KL(softmax(h W_ref^T) || softmax(h W_hat^T)) and top-1 agreement over held-out final-norm
hidden states, streamed over vocabulary chunks with an online log-sum-exp so a 248320-token
vocabulary never needs a full [N, V] logits matrix; `capture_final_hidden` collects the inputs
of lm_head from a transformers model without computing logits.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from qwenquant.errors import StageError
from qwenquant.modeling.runtime import torch_device

if TYPE_CHECKING:
    from transformers import PreTrainedModel

log = logging.getLogger(__name__)

__all__ = ["StopForward", "capture_final_hidden", "compare_heads", "head_quality", "heads_quality"]


def _as_weight(w: Any, device: str | torch.device | None = None) -> Any:
    """A [V, D] tensor (or any row-sliceable head, e.g. `RtnHead`) as it is; anything with
    `dequantize()` (a QuantizedHead) as `_RowDequant`."""
    if isinstance(w, torch.Tensor) or not hasattr(w, "dequantize"):
        return w
    return _RowDequant(w, torch_device(device))


class _RowDequant:
    """A QuantizedHead seen as its dequantized [V, D] weight, one row slice at a time on `device`
    (the same ops as `dequantize()`, on the slice the KL pass reads): the whole 248320 x 5120 head
    is never dequantized on the host."""

    def __init__(self, q: Any, device: torch.device) -> None:
        self.q, self.device, self.shape = q, device, q.shape

    def __getitem__(self, rows: slice) -> torch.Tensor:
        import dataclasses

        part = dataclasses.replace(
            self.q, int=self.q.int[rows].to(self.device), scale=self.q.scale[rows].to(self.device)
        )
        return part.dequantize()


@torch.no_grad()
def heads_quality(
    W_ref: torch.Tensor,
    W_hats: Sequence[Any],
    hidden: torch.Tensor,
    *,
    chunk: int = 1024,
    vocab_chunk: int = 32768,
    device: str | torch.device | None = None,
) -> list[dict[str, float]]:
    """Mean KL(ref || hat) in nats and top-1 agreement for several candidate heads in one pass.

    Each vocabulary chunk of every head is moved to `device` once (fp32); all tokens are
    streamed through it. Memory on `device`: the hidden states, (1 + len(W_hats)) weight
    chunks of vocab_chunk x D fp32 and a few chunk x vocab_chunk logits blocks.
    """
    dev = torch_device(device)
    V, D = W_ref.shape
    for w in W_hats:
        if tuple(w.shape) != (V, D):
            raise ValueError(f"candidate head shape {tuple(w.shape)} differs from reference {(V, D)}")
    h = hidden.reshape(-1, D).to(device=dev, dtype=torch.float32)
    N = h.shape[0]
    k = len(W_hats)
    neg_inf = torch.full((N,), float("-inf"), device=dev)
    m_ref, s_ref = neg_inf.clone(), torch.zeros(N, device=dev)
    top_ref_val, top_ref_idx = neg_inf.clone(), torch.zeros(N, dtype=torch.long, device=dev)
    m_hat = [neg_inf.clone() for _ in range(k)]
    s_hat = [torch.zeros(N, device=dev) for _ in range(k)]
    # t = sum_v exp(a_v - m_ref) * (a_v - b_v), rescaled with m_ref
    t_hat = [torch.zeros(N, device=dev) for _ in range(k)]
    top_val = [neg_inf.clone() for _ in range(k)]
    top_idx = [torch.zeros(N, dtype=torch.long, device=dev) for _ in range(k)]

    for v0 in range(0, V, vocab_chunk):
        v1 = min(v0 + vocab_chunk, V)
        # to the device first, then fp32 there: no fp32 copy of the chunk on the host
        wr = W_ref[v0:v1].to(dev).to(torch.float32)
        wh = [w[v0:v1].to(dev).to(torch.float32) for w in W_hats]
        for n0 in range(0, N, chunk):
            n1 = min(n0 + chunk, N)
            a = h[n0:n1] @ wr.t()
            a_max, a_arg = a.max(dim=1)
            new_m = torch.maximum(m_ref[n0:n1], a_max)
            decay = torch.exp(m_ref[n0:n1] - new_m)
            p = torch.exp(a - new_m.unsqueeze(1))
            s_ref[n0:n1] = s_ref[n0:n1] * decay + p.sum(dim=1)
            better = a_max > top_ref_val[n0:n1]
            top_ref_val[n0:n1] = torch.where(better, a_max, top_ref_val[n0:n1])
            top_ref_idx[n0:n1] = torch.where(better, a_arg + v0, top_ref_idx[n0:n1])
            for j in range(k):
                b = h[n0:n1] @ wh[j].t()
                _fold_candidate(a, b, p, decay, n0, n1, v0, t_hat[j], m_hat[j], s_hat[j], top_val[j], top_idx[j])
            m_ref[n0:n1] = new_m
        del wr, wh

    return _results(m_ref, s_ref, top_ref_idx, m_hat, s_hat, t_hat, top_idx, N)


def _fold_candidate(
    a: torch.Tensor,
    b: torch.Tensor,
    p: torch.Tensor,
    decay: torch.Tensor,
    n0: int,
    n1: int,
    v0: int,
    t_hat: torch.Tensor,
    m_hat: torch.Tensor,
    s_hat: torch.Tensor,
    top_val: torch.Tensor,
    top_idx: torch.Tensor,
) -> None:
    """One candidate's logits block `b` (rows n0:n1, vocabulary from v0) folded into its running sums in place,
    beside the reference block `a`, its exponentials `p` and the decay of the reference's running maximum."""
    t_hat[n0:n1] = t_hat[n0:n1] * decay + (p * (a - b)).sum(dim=1)
    b_max, b_arg = b.max(dim=1)
    new_mb = torch.maximum(m_hat[n0:n1], b_max)
    s_hat[n0:n1] = s_hat[n0:n1] * torch.exp(m_hat[n0:n1] - new_mb) + torch.exp(b - new_mb.unsqueeze(1)).sum(dim=1)
    m_hat[n0:n1] = new_mb
    better_b = b_max > top_val[n0:n1]
    top_val[n0:n1] = torch.where(better_b, b_max, top_val[n0:n1])
    top_idx[n0:n1] = torch.where(better_b, b_arg + v0, top_idx[n0:n1])


def _results(
    m_ref: torch.Tensor,
    s_ref: torch.Tensor,
    top_ref_idx: torch.Tensor,
    m_hat: list[torch.Tensor],
    s_hat: list[torch.Tensor],
    t_hat: list[torch.Tensor],
    top_idx: list[torch.Tensor],
    N: int,
) -> list[dict[str, float]]:
    """Each candidate's mean KL(ref || hat) and top-1 agreement from the running sums."""
    lse_ref = m_ref + torch.log(s_ref)
    out = []
    for j in range(len(m_hat)):
        lse_hat = m_hat[j] + torch.log(s_hat[j])
        kl = t_hat[j] / s_ref - lse_ref + lse_hat
        out.append(
            {
                "kl": float(kl.double().mean()),
                "top1": float((top_idx[j] == top_ref_idx).double().mean()),
                "tokens": int(N),
            }
        )
    return out


def head_quality(
    W_ref: torch.Tensor,
    W_hat: Any,
    hidden: torch.Tensor,
    *,
    chunk: int = 1024,
    vocab_chunk: int = 32768,
    device: str | torch.device | None = None,
) -> dict[str, float]:
    """Mean KL(softmax(h W_ref^T) || softmax(h W_hat^T)) and top-1 agreement on `hidden` [N, D]."""
    return heads_quality(
        W_ref, [_as_weight(W_hat, device)], hidden, chunk=chunk, vocab_chunk=vocab_chunk, device=device
    )[0]


def compare_heads(
    W_ref: torch.Tensor,
    rtn: Any,
    gptq: Any,
    hidden: torch.Tensor,
    *,
    chunk: int = 1024,
    vocab_chunk: int = 32768,
    device: str | torch.device | None = None,
) -> dict[str, Any]:
    """{rtn: {kl, top1}, gptq: {kl, top1}, kl_reduction_pct} on held-out hidden states.

    `rtn`/`gptq` are [V, D] tensors, QuantizedHeads or RtnHeads. kl_reduction_pct > 0 means GPTQ is
    closer to the reference than RTN.
    """
    q_rtn, q_gptq = heads_quality(
        W_ref,
        [_as_weight(rtn, device), _as_weight(gptq, device)],
        hidden,
        chunk=chunk,
        vocab_chunk=vocab_chunk,
        device=device,
    )
    reduction = 100.0 * (1.0 - q_gptq["kl"] / q_rtn["kl"]) if q_rtn["kl"] > 0 else 0.0
    return {"rtn": q_rtn, "gptq": q_gptq, "kl_reduction_pct": reduction}


class StopForward(Exception):
    """Raised from the lm_head hook to end a forward pass once the head's input is known."""

    def __init__(self, hidden: torch.Tensor) -> None:
        super().__init__("lm_head input captured")
        self.hidden = hidden


def _split_batch(batch: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    if isinstance(batch, torch.Tensor):
        return batch, None
    if isinstance(batch, Mapping):
        return batch["input_ids"], batch.get("attention_mask")
    raise TypeError(f"a calibration batch must be a tensor or a mapping with input_ids, got {type(batch)}")


@torch.no_grad()
def capture_final_hidden(
    model: PreTrainedModel,
    batches: Iterable[Any],
    on_batch: Callable[[torch.Tensor], None],
) -> int:
    """Run `model` over token batches and hand lm_head's input [tokens, D] to `on_batch`.

    A pre-hook on the output embeddings takes the final-norm hidden states and stops the
    forward before the [B, T, V] logits exist. Padding positions (attention_mask == 0) are
    dropped. Returns the number of tokens handed over.
    """
    lm_head = model.get_output_embeddings()
    if lm_head is None:
        raise StageError(
            "the model has no output embeddings (lm_head)",
            hint="load a *ForCausalLM or *ForConditionalGeneration model",
        )

    def hook(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        raise StopForward(args[0] if args else kwargs["input"])

    handle = lm_head.register_forward_pre_hook(hook, with_kwargs=True)
    model_device = next(model.parameters()).device
    seen = 0
    try:
        for batch in batches:
            input_ids, mask = _split_batch(batch)
            input_ids = input_ids.to(model_device)
            if mask is not None:
                mask = mask.to(model_device)
            try:
                model(input_ids=input_ids, attention_mask=mask, use_cache=False)
            except StopForward as stop:
                hidden = stop.hidden
            else:
                raise StageError(
                    "the forward pass never reached lm_head", hint="report this model class as unsupported"
                )
            hidden = hidden.reshape(*input_ids.shape, hidden.shape[-1])
            tokens = hidden[mask.bool()] if mask is not None else hidden.reshape(-1, hidden.shape[-1])
            seen += tokens.shape[0]
            on_batch(tokens)
    finally:
        handle.remove()
    return seen
