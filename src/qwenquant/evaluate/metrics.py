"""Paired quality figures over evaluation windows (pure torch/math, no I/O)."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

Z95 = 1.959964  # two-sided 95% normal quantile (windows are many; a t quantile changes little)


def window_nll(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token negative log-likelihood per window [B] from logits [B, T, V], targets [B, T]."""
    nll = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="none")
    return nll.view(targets.shape).mean(dim=1)


def window_kl_top1(ref_logits: torch.Tensor, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per window: mean KL(ref || arm) in nats and top-1 agreement with the reference, [B] each."""
    ref_lp = F.log_softmax(ref_logits.float(), dim=-1)
    lp = F.log_softmax(logits.float(), dim=-1)
    kl = (ref_lp.exp() * (ref_lp - lp)).sum(-1).mean(dim=1)
    top1 = (ref_logits.argmax(-1) == logits.argmax(-1)).float().mean(dim=1)
    return kl, top1


def paired_ppl(ref_nll: torch.Tensor, nll: torch.Tensor) -> dict[str, Any]:
    """Perplexities of both arms over equal-length windows and the relative delta with a paired 95% CI.

    delta = exp(mean(nll - ref_nll)) - 1 (the perplexity ratio minus one); the CI is the normal
    interval of the mean per-window difference, mapped the same way.
    """
    d = (nll - ref_nll).double()
    n = d.numel()
    mean = float(d.mean())
    se = float(d.std(unbiased=True)) / math.sqrt(n) if n > 1 else float("nan")
    return {
        "ppl_reference": math.exp(float(ref_nll.double().mean())),
        "ppl": math.exp(float(nll.double().mean())),
        "delta_pct": 100 * math.expm1(mean),
        "ci95_pct": [100 * math.expm1(mean - Z95 * se), 100 * math.expm1(mean + Z95 * se)],
        "windows_worse": int((d > 0).sum()),
        "windows": n,
    }
