"""Paired quality figures over evaluation windows (pure torch/math, no I/O; the KL tail as its typed report part)."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F

from qwenquant.evaluate.reportparts import KlPeak, KlTailSupport, MtpAgreement

Z95 = 1.959964  # two-sided 95% normal quantile (the limit of `t_quantile` as the windows grow)
KL_TAIL = (("kl_p99", 0.99), ("kl_p999", 0.999))  # per-token KL quantiles the report gives beside the mean


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for num in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b)."""
    if x <= 0.0 or x >= 1.0:
        return 0.0 if x <= 0.0 else 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """Student's t distribution function with `df` degrees of freedom."""
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """Student's t quantile (inverse of `t_cdf`, bisection to 1e-12): t_quantile(0.975, 31) = 2.0395."""
    if not 0.0 < p < 1.0 or df <= 0:
        return float("nan")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        lo, hi = hi, hi * 2.0
    while hi - lo > 1e-12 * max(1.0, hi):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
    return 0.5 * (lo + hi)


def mean_ci95(values: torch.Tensor) -> tuple[float, list[float]]:
    """Mean over windows and its two-sided 95% interval from the t distribution (n - 1 degrees of
    freedom: with 32 windows the normal z = 1.96 is about 4% too narrow)."""
    v = values.double().flatten()
    n = v.numel()
    mean = float(v.mean())
    if n < 2:
        return mean, [float("nan"), float("nan")]
    half = t_quantile(0.975, n - 1) * float(v.std(unbiased=True)) / math.sqrt(n)
    return mean, [mean - half, mean + half]


def token_kl(ref_logits: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """KL(ref || arm) in nats per token, [B, T]."""
    ref_lp = F.log_softmax(ref_logits.float(), dim=-1)
    lp = F.log_softmax(logits.float(), dim=-1)
    return (ref_lp.exp() * (ref_lp - lp)).sum(-1)


def kl_tail(per_token: torch.Tensor) -> dict[str, float]:
    """The per-token KL quantiles of `KL_TAIL` (linear interpolation) over every token given."""
    v = per_token.double().flatten()
    return {k: float(torch.quantile(v, q)) for k, q in KL_TAIL}


def kl_tail_support(per_token: torch.Tensor, q: float = 0.999, resamples: int = 1000, seed: int = 0) -> KlTailSupport:
    """What the per-token KL quantile `q` of `per_token` [windows, tokens] rests on: its 95% interval
    over windows (percentile bootstrap, windows resampled with replacement, fixed seed), how many
    windows hold tokens above it, the share of those tokens in the window holding most of them, and
    where the largest per-token KL is ({"window", "token", "kl"})."""
    v = per_token.double()
    n = v.shape[0]
    threshold = float(torch.quantile(v.flatten(), q))
    above = (v > threshold).sum(dim=1)
    gen = torch.Generator().manual_seed(seed)
    picks = torch.randint(0, n, (resamples, n), generator=gen)
    boots = torch.stack([torch.quantile(v[i].flatten(), q) for i in picks])
    lo, hi = (float(torch.quantile(boots, x)) for x in (0.025, 0.975))
    top = int(above.argmax())
    flat = int(v.argmax())
    return KlTailSupport(
        value=threshold,
        ci95=(lo, hi),
        windows_above=int((above > 0).sum()),
        windows=n,
        top_window=top,
        top_window_share=float(above[top] / above.sum()) if above.sum() > 0 else 0.0,
        max=KlPeak(window=flat // v.shape[1], token=flat % v.shape[1], kl=float(v.flatten()[flat])),
    )


def window_nll(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token negative log-likelihood per window [B] from logits [B, T, V], targets [B, T]."""
    nll = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="none")
    return nll.view(targets.shape).mean(dim=1)


def window_kl_top1(ref_logits: torch.Tensor, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per window: mean KL(ref || arm) in nats and top-1 agreement with the reference, [B] each."""
    kl = token_kl(ref_logits, logits).mean(dim=1)
    top1 = (ref_logits.argmax(-1) == logits.argmax(-1)).float().mean(dim=1)
    return kl, top1


@dataclass(frozen=True)
class PairedPpl:
    """Both arms' perplexities and the relative delta with its paired 95% interval (the keys of an arm's figures)."""

    ppl_reference: float
    ppl: float
    delta_pct: float
    ci95_pct: list[float]
    windows_worse: int
    windows: int

    def fields(self) -> dict[str, float | int | list[float]]:
        """As the arm's figures name them."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def paired_ppl(ref_nll: torch.Tensor, nll: torch.Tensor) -> PairedPpl:
    """Perplexities of both arms over equal-length windows and the relative delta with a paired 95% CI.

    delta = exp(mean(nll - ref_nll)) - 1 (the perplexity ratio minus one); the CI is the t interval
    (`mean_ci95`) of the mean per-window difference, mapped the same way.
    """
    d = (nll - ref_nll).double()
    n = d.numel()
    mean, (lo, hi) = mean_ci95(d)
    return PairedPpl(
        ppl_reference=math.exp(float(ref_nll.double().mean())),
        ppl=math.exp(float(nll.double().mean())),
        delta_pct=100 * math.expm1(mean),
        ci95_pct=[100 * math.expm1(lo), 100 * math.expm1(hi)],
        windows_worse=int((d > 0).sum()),
        windows=n,
    )


def mtp_agreement(agree: torch.Tensor) -> MtpAgreement:
    """An MTP head's t+2 agreement per window [N]: its mean with the t interval, and the first-draft acceptance
    length (1 + the mean)."""
    mean, ci = mean_ci95(agree)
    return MtpAgreement(agree=mean, agree_ci95=(ci[0], ci[1]), acceptance_length_1=1 + mean)
