"""Offline eval: an artifact against its bf16 source on fixed held-out windows, paired per window.

Arms (all through the same `TextForward` over dense weights):
  reference          the source, bf16 weights
  w4a16-body         the artifact's body with the source's bf16 lm_head
  w4a16+rtn-head     the artifact's body with a round-to-nearest int4 lm_head (the baseline)
  artifact           the artifact as shipped (body + its own, calibrated, head)
MTP: how often the MTP head's t+2 prediction equals the model's own greedy t+2 token (the rate at
which a greedy server would accept the first draft), for the reference and the artifact, and for the
source's bf16 MTP head on the artifact's own hidden states and head (`artifact_bf16_mtp`): on the same
windows against the artifact's head, the difference is what quantizing the MTP head costs.
`same_draft` is the share of positions where the two heads draft the very same token (where it is
near 1, two servers can count the same acceptance at every draft position).
Each KL comes with its per-token tail (p99, p99.9); every interval is the t interval over windows,
but the artifact's p99.9, which a handful of tokens decide, gets a bootstrap interval over windows
and the windows its tail tokens lie in (`kl_p999_support`).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch

from qwenquant.evaluate import metrics
from qwenquant.evaluate.forward import DenseForward, TextForward
from qwenquant.evaluate.texts import window_text
from qwenquant.evaluate.weights import load_dense, rtn_head

log = logging.getLogger(__name__)

ARMS = ("w4a16-body", "w4a16+rtn-head", "artifact")


def _mtp_drafts(fwd: TextForward, ids: torch.Tensor, hidden: torch.Tensor, head: torch.Tensor) -> torch.Tensor | None:
    """The MTP head's t+2 argmax at every position [B, L-1] (its first draft); None without MTP."""
    out = fwd.mtp_hidden(ids, hidden)
    if out is None:
        return None
    return (out @ head.T).argmax(-1)


def _agree(drafts: torch.Tensor, greedy: torch.Tensor) -> torch.Tensor:
    """Per window: fraction of positions where the draft equals the model's greedy t+2 token."""
    return (drafts == greedy[:, 1:]).float().mean(dim=1).cpu()


def _batch_stats(ref: TextForward, art: TextForward, heads: dict[str, torch.Tensor], ids: torch.Tensor
                 ) -> tuple[dict[str, dict[str, torch.Tensor]], torch.Tensor]:
    """Per-window figures of every arm for one batch, and the reference's hidden states (for the head test)."""
    h_ref = ref.final_hidden(ids)
    h_art = art.final_hidden(ids)
    # every figure on the hidden states' device (a 248k-vocabulary logit batch is GBs: no host copies)
    targets = ids[:, 1:].to(h_ref.device)
    ref_full = h_ref @ heads["reference"].T
    ref_logits, greedy = ref_full[:, :-1], {"reference": ref_full.argmax(-1)}
    stats: dict[str, dict[str, torch.Tensor]] = {"reference": {"nll": metrics.window_nll(ref_logits, targets).cpu()}}
    for arm, (hidden, head) in {"w4a16-body": (h_art, heads["reference"]), "w4a16+rtn-head": (h_art, heads["rtn"]),
                                "artifact": (h_art, heads["artifact"])}.items():
        full = hidden @ head.T
        tok_kl = metrics.token_kl(ref_logits, full[:, :-1])
        top1 = (ref_logits.argmax(-1) == full[:, :-1].argmax(-1)).float().mean(dim=1)
        stats[arm] = {"nll": metrics.window_nll(full[:, :-1], targets).cpu(), "kl": tok_kl.mean(dim=1).cpu(),
                      "top1": top1.cpu(), "kl_tokens": tok_kl.cpu()}
        greedy[arm] = full.argmax(-1)
        del full
    drafts: dict[str, torch.Tensor] = {}
    for arm, fwd, hidden, head in (("reference", ref, h_ref, heads["reference"]), ("artifact", art, h_art, heads["artifact"])):
        d = _mtp_drafts(fwd, ids, hidden, head)
        if d is not None:
            drafts[arm] = d
            stats[arm]["mtp_agree"] = _agree(d, greedy[arm])
    if "artifact" in drafts:  # the source's bf16 MTP head on the artifact's states, head and greedy
        d = _mtp_drafts(ref, ids, h_art, heads["artifact"])
        if d is not None:
            stats["artifact"]["mtp_agree_bf16"] = _agree(d, greedy["artifact"])
            stats["artifact"]["mtp_same_draft"] = (d == drafts["artifact"]).float().mean(dim=1).cpu()
    return stats, h_ref[:, :-1].reshape(-1, h_ref.shape[-1]).cpu()


def evaluate_forwards(ref: TextForward, art: TextForward, heads: dict[str, torch.Tensor], windows: torch.Tensor,
                      *, batch: int = 8) -> dict[str, Any]:
    """Every figure of the report from two forwards, the three heads and the windows [N, L]."""
    from qwenquant.console import timed
    from qwenquant.modeling.head_quality import compare_heads

    per: dict[str, dict[str, list[torch.Tensor]]] = {}
    hidden = []
    with timed(log, f"eval: logits, perplexity, KL and MTP of {windows.shape[0]} windows"):
        for i in range(0, windows.shape[0], batch):
            stats, h = _batch_stats(ref, art, heads, windows[i: i + batch])
            hidden.append(h)
            for arm, figs in stats.items():
                for k, v in figs.items():
                    per.setdefault(arm, {}).setdefault(k, []).append(v)
    cat = {arm: {k: torch.cat(v) for k, v in figs.items()} for arm, figs in per.items()}
    ref_nll = cat["reference"]["nll"]
    arms: dict[str, Any] = {"reference": {"ppl": metrics.paired_ppl(ref_nll, ref_nll)["ppl"]}}
    for arm in ARMS:
        kl, kl_ci = metrics.mean_ci95(cat[arm]["kl"])
        arms[arm] = {**metrics.paired_ppl(ref_nll, cat[arm]["nll"]), "kl": kl, "kl_ci95": kl_ci,
                     **metrics.kl_tail(cat[arm]["kl_tokens"]), "top1": float(cat[arm]["top1"].mean())}
    # the artifact's KL p99.9 rests on a few tokens: its interval over windows and where they are
    arms["artifact"]["kl_p999_support"] = metrics.kl_tail_support(cat["artifact"]["kl_tokens"])
    mtp = mtp_figures(cat)
    held = torch.cat(hidden)
    # on the heads' own device: a .cpu() copy of three float32 27B heads is 15 GB of host memory
    with timed(log, f"eval: lm_head alone on {held.shape[0]} held-out states"):
        head = compare_heads(heads["reference"], heads["rtn"], heads["artifact"], held, device=heads["reference"].device)
    head["ratio"] = head["gptq"]["kl"] / head["rtn"]["kl"] if head["rtn"]["kl"] > 0 else None
    return {"arms": arms, "lm_head": head, "mtp": mtp}


def mtp_figures(cat: dict[str, dict[str, torch.Tensor]]) -> dict[str, Any]:
    """Pure: MTP t+2 agreement per arm (mean, t interval over windows, first-draft acceptance length),
    the change vs the reference, and the int4 vs bf16 MTP head on the same windows (paired, in points,
    and the share of positions where both heads draft the same token)."""
    keys = {"reference": "mtp_agree", "artifact": "mtp_agree", "artifact_bf16_mtp": "mtp_agree_bf16"}
    mtp: dict[str, Any] = {}
    for name, key in keys.items():
        src = cat["artifact" if name == "artifact_bf16_mtp" else name]
        if key in src:
            agree, ci = metrics.mean_ci95(src[key])
            mtp[name] = {"agree": agree, "agree_ci95": ci, "acceptance_length_1": 1 + agree}
    if "reference" in mtp and "artifact" in mtp:
        mtp["change_pct"] = 100 * (mtp["artifact"]["acceptance_length_1"] / mtp["reference"]["acceptance_length_1"] - 1)
    if "artifact_bf16_mtp" in mtp:
        delta, ci = metrics.mean_ci95(cat["artifact"]["mtp_agree"] - cat["artifact"]["mtp_agree_bf16"])
        mtp["int4_vs_bf16"] = {"delta_points": 100 * delta, "ci95_points": [100 * ci[0], 100 * ci[1]]}
        if "mtp_same_draft" in cat["artifact"]:  # how often the two heads draft the very same token
            mtp["int4_vs_bf16"]["same_draft"] = float(cat["artifact"]["mtp_same_draft"].mean())
    return mtp


# Above this many bytes of source weights eval streams one decoder layer at a time (evaluate/streamed.py):
# the dense path holds both arms whole, in float32 (4x the bf16 bytes, twice).
STREAM_ABOVE_BYTES = 2 * 10**9


def weight_bytes(folder: Path) -> int:
    """Total size of a folder's *.safetensors files."""
    return sum(p.stat().st_size for p in Path(folder).glob("*.safetensors"))


def run_offline(reference: Path, artifact: Path, windows: torch.Tensor, *, device: str = "cpu",
                batch: int = 8, streamed: bool | None = None) -> dict[str, Any]:
    """Evaluate `artifact` against `reference` on `windows` [N, L]: dense float weights on `device`,
    or (`streamed`, default above STREAM_ABOVE_BYTES) one decoder layer at a time from the shards."""
    start = time.monotonic()
    if streamed is None:
        streamed = weight_bytes(reference) > STREAM_ABOVE_BYTES
    if streamed:
        from qwenquant.evaluate.streamed import streamed_forwards

        ref, art, heads = streamed_forwards(reference, artifact, windows, device=device)
        batch = 1  # a window's logits over a 248k vocabulary are 0.25 GB, and the KL holds a few such
    else:
        ref_cfg, ref_t = load_dense(reference)
        art_cfg, art_t = load_dense(artifact)
        heads = {"reference": ref_t["lm_head.weight"], "rtn": rtn_head(ref_t["lm_head.weight"]),
                 "artifact": art_t["lm_head.weight"]}
        heads = {k: v.float().to(device) for k, v in heads.items()}
        ref, art = DenseForward(ref_cfg, ref_t, device), DenseForward(art_cfg, art_t, device)
    report = evaluate_forwards(ref, art, heads, windows, batch=batch)
    top = report["arms"]["artifact"]["kl_p999_support"]["max"]
    # the text the largest per-token KL rests on: up to 16 tokens of context and the token predicted
    top["text"] = window_text(reference, windows[top["window"], max(0, top["token"] - 15): top["token"] + 2])
    report.update(windows=int(windows.shape[0]), window_len=int(windows.shape[1]), device=device,
                  forward="streamed" if streamed else "dense", seconds=round(time.monotonic() - start, 1))
    return report
