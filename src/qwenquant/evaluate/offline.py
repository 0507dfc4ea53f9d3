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
With int8 activations asked (`--activations int8`), one more arm:
  artifact+int8-act  the artifact's weights run as vLLM's int8-activation Marlin path would run every
                     int4 Linear (body, lm_head, MTP head: evaluate/int8act.py), against the reference
                     like the others and, under `vs_artifact`, against the artifact (the W4A16 arm)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.nn.functional as F

from qwenquant.evaluate import metrics
from qwenquant.evaluate.forward import DenseForward, TextForward
from qwenquant.evaluate.longwindow import POSITION_CHUNK
from qwenquant.evaluate.reportparts import (
    Arm,
    Arms,
    Figures,
    Int4VsBf16,
    Int8Arm,
    Int8Linears,
    LmHead,
    Mtp,
    MtpAgreement,
    MtpInt8,
    OfflineFigures,
    OfflineRun,
    ReferenceArm,
)
from qwenquant.evaluate.texts import window_text
from qwenquant.evaluate.weights import dequantize, load_dense, raw_tensors, read_config, rtn_head, text_config

log = logging.getLogger(__name__)

ARMS = ("w4a16-body", "w4a16+rtn-head", "artifact")
INT8_ARM = "artifact+int8-act"
# the int8 arm: its forward and its lm_head (hidden [B, L, H] -> logits)
Int8Run = tuple[TextForward, Callable[[torch.Tensor], torch.Tensor]]
PeakText = Callable[[int, int], str | None]  # (window, token) -> the text a per-token KL follows


def _mtp_drafts(
    fwd: TextForward, ids: torch.Tensor, hidden: torch.Tensor, head: Callable[[torch.Tensor], torch.Tensor]
) -> torch.Tensor | None:
    """The MTP head's t+2 argmax at every position of ids/hidden [B, T] but the last (its first draft); None
    without MTP."""
    out = fwd.mtp_hidden(ids, hidden)
    if out is None:
        return None
    return head(out).argmax(-1)


def _token_stats(
    ref_logits: torch.Tensor, logits: torch.Tensor, targets: torch.Tensor | None, suffix: str = ""
) -> dict[str, torch.Tensor]:
    """Per-token KL and top-1 of `logits` against `ref_logits` and (when `targets` are given) NLL, [B, T] each."""
    out = {
        "kl_tokens" + suffix: metrics.token_kl(ref_logits, logits),
        "top1" + suffix: (ref_logits.argmax(-1) == logits.argmax(-1)).float(),
    }
    if targets is not None:
        out["nll"] = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="none").view(
            targets.shape
        )
    return out


def _chunk_stats(
    fwds: dict[str, TextForward],
    hid: dict[str, torch.Tensor],
    heads: dict[str, Callable[[torch.Tensor], torch.Tensor]],
    ids: torch.Tensor,
    s: int,
    e: int,
) -> dict[str, dict[str, torch.Tensor]]:
    """Per-token figures of every arm for predicting positions s+1..e (from hidden rows s..e: one row
    more than predicted, for the greedy t+2 token the MTP drafts are held against)."""
    rows = {name: h[:, s : e + 1] for name, h in hid.items()}
    cut = ids[:, s : e + 1]
    targets = ids[:, s + 1 : e + 1].to(rows["reference"].device)
    ref_full = heads["reference"](rows["reference"])
    ref_logits, greedy = ref_full[:, :-1], {"reference": ref_full.argmax(-1)}
    stats: dict[str, dict[str, torch.Tensor]] = {
        "reference": {
            "nll": F.cross_entropy(ref_logits.flatten(0, 1), targets.flatten(), reduction="none").view(targets.shape)
        }
    }
    arm_rows = {
        "w4a16-body": ("artifact", "reference"),
        "w4a16+rtn-head": ("artifact", "rtn"),
        "artifact": ("artifact", "artifact"),
    }
    if INT8_ARM in hid:
        arm_rows[INT8_ARM] = (INT8_ARM, INT8_ARM)
    art_logits = None
    for arm, (h, head) in arm_rows.items():
        full = heads[head](rows[h])
        stats[arm] = _token_stats(ref_logits, full[:, :-1], targets)
        greedy[arm] = full.argmax(-1)
        if arm == "artifact" and INT8_ARM in hid:
            art_logits = full[:, :-1]
        elif arm == INT8_ARM and art_logits is not None:
            stats[arm].update(_token_stats(art_logits, full[:, :-1], None, suffix="_vs_artifact"))
        del full
    drafts: dict[str, torch.Tensor] = {}
    for arm in ("reference", "artifact", INT8_ARM):
        if arm in hid:
            d = _mtp_drafts(fwds[arm], cut, rows[arm], heads[arm])
            if d is not None:
                drafts[arm] = d
                stats[arm]["mtp_agree"] = (d == greedy[arm][:, 1:]).float()
    if "artifact" in drafts:  # the source's bf16 MTP head on the artifact's states, head and greedy
        d = _mtp_drafts(fwds["reference"], cut, rows["artifact"], heads["artifact"])
        if d is not None:
            stats["artifact"]["mtp_agree_bf16"] = (d == greedy["artifact"][:, 1:]).float()
            stats["artifact"]["mtp_same_draft"] = (d == drafts["artifact"]).float()
    return stats


def _batch_stats(
    ref: TextForward, art: TextForward, heads: dict[str, torch.Tensor], ids: torch.Tensor, int8: Int8Run | None = None
) -> tuple[dict[str, dict[str, torch.Tensor]], torch.Tensor]:
    """Per-window figures of every arm for one batch, and the reference's hidden states (for the head test).
    The logits exist POSITION_CHUNK positions at a time (a 128K window's logits over a 248k vocabulary would
    be 130 GB); every figure is a mean over positions, so the chunks change no value beyond float rounding."""
    fwds: dict[str, TextForward] = {"reference": ref, "artifact": art}
    # every figure on the hidden states' device (a 248k-vocabulary logit batch is GBs: no host copies)
    hid = {"reference": ref.final_hidden(ids), "artifact": art.final_hidden(ids)}

    def head_logits(w: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
        return lambda h: h @ w.T

    fns: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {k: head_logits(w) for k, w in heads.items()}
    if int8 is not None:
        fwds[INT8_ARM], fns[INT8_ARM] = int8
        hid[INT8_ARM] = int8[0].final_hidden(ids)
    per: dict[str, dict[str, list[torch.Tensor]]] = {}
    last = ids.shape[1] - 1
    for s in range(0, last, POSITION_CHUNK):
        for arm, figs in _chunk_stats(fwds, hid, fns, ids, s, min(s + POSITION_CHUNK, last)).items():
            for k, v in figs.items():
                per.setdefault(arm, {}).setdefault(k, []).append(v)
    stats: dict[str, dict[str, torch.Tensor]] = {}
    for arm, chunks in per.items():
        tok = {k: torch.cat(v, dim=1) for k, v in chunks.items()}
        stats[arm] = {k: v.mean(dim=1).cpu() for k, v in tok.items() if not k.startswith("kl_tokens")}
        stats[arm].update(
            {k.replace("kl_tokens", "kl"): v.mean(dim=1).cpu() for k, v in tok.items() if k.startswith("kl_tokens")}
        )
        stats[arm].update({k: v.cpu() for k, v in tok.items() if k.startswith("kl_tokens")})
    h_ref = hid["reference"]
    return stats, h_ref[:, :-1].reshape(-1, h_ref.shape[-1]).cpu()


def evaluate_forwards(fw: Forwards, windows: torch.Tensor, peak_text: PeakText | None = None) -> OfflineFigures:
    """Every figure of the report from the two forwards, the three heads and the windows [N, L] (and the
    int8-activation arm's, given its forward and head); `peak_text(window, token)`: the text the largest
    per-token KL follows."""
    from qwenquant.console import timed
    from qwenquant.modeling.head_quality import compare_heads

    per: dict[str, dict[str, list[torch.Tensor]]] = {}
    hidden = []
    with timed(log, f"eval: logits, perplexity, KL and MTP of {windows.shape[0]} windows"):
        for i in range(0, windows.shape[0], fw.batch):
            stats, states = _batch_stats(fw.ref, fw.art, fw.heads, windows[i : i + fw.batch], fw.int8)
            hidden.append(states)
            for arm, figs in stats.items():
                for k, v in figs.items():
                    per.setdefault(arm, {}).setdefault(k, []).append(v)
    cat = {arm: {k: torch.cat(v) for k, v in figs.items()} for arm, figs in per.items()}
    ref_nll = cat["reference"]["nll"]
    arms: dict[str, ReferenceArm | Arm | Int8Arm] = {
        "reference": ReferenceArm(ppl=metrics.paired_ppl(ref_nll, ref_nll).ppl)
    }
    arms |= {arm: _figures(Arm, ref_nll, cat[arm]) for arm in ARMS}
    if INT8_ARM in cat:  # outputs whose int32 accumulator would wrap in Marlin (0 expected)
        arms[INT8_ARM] = int8_figures(ref_nll, cat["artifact"]["nll"], cat[INT8_ARM]).model_copy(
            update={"int32_overflows": fw.overflows(), "int8_linears": fw.int8_linears}
        )
    # the artifact's KL p99.9 rests on a few tokens: its interval over windows and where they are
    support = metrics.kl_tail_support(cat["artifact"]["kl_tokens"])
    text = peak_text(support.max.window, support.max.token) if peak_text is not None else None
    if text is not None:
        support = support.model_copy(update={"max": support.max.model_copy(update={"text": text})})
    arms["artifact"] = arms["artifact"].model_copy(update={"kl_p999_support": support})
    held = torch.cat(hidden)
    # on the heads' own device: a .cpu() copy of three float32 27B heads is 15 GB of host memory
    with timed(log, f"eval: lm_head alone on {held.shape[0]} held-out states"):
        h = fw.heads
        head = compare_heads(h["reference"], h["rtn"], h["artifact"], held, device=h["reference"].device)
    ratio = head["gptq"]["kl"] / head["rtn"]["kl"] if head["rtn"]["kl"] > 0 else None
    return OfflineFigures(
        arms=Arms.model_validate(arms), lm_head=LmHead.model_validate({**head, "ratio": ratio}), mtp=mtp_figures(cat)
    )


FiguresT = TypeVar("FiguresT", bound=Figures)


def _figures(kind: type[FiguresT], base_nll: torch.Tensor, per: dict[str, torch.Tensor], suffix: str = "") -> FiguresT:
    """One arm against a base: paired perplexity, KL mean with its interval and tail, top-1 agreement."""
    ppl, (kl, kl_ci) = metrics.paired_ppl(base_nll, per["nll"]), metrics.mean_ci95(per["kl" + suffix])
    tail, top1 = metrics.kl_tail(per["kl_tokens" + suffix]), float(per["top1" + suffix].mean())
    return kind.model_validate({**ppl.fields(), "kl": kl, "kl_ci95": kl_ci, **tail, "top1": top1})


def int8_figures(ref_nll: torch.Tensor, art_nll: torch.Tensor, per: dict[str, torch.Tensor]) -> Int8Arm:
    """Pure: the int8-activation arm against the reference (the other arms' keys) and, under
    `vs_artifact`, against the artifact: paired perplexity, KL mean and tail, top-1 agreement (its int32
    overflows and int8 Linears, counted by the run, 0 and none here)."""
    vs = _figures(Figures, art_nll, per, "_vs_artifact")
    none = Int8Linears(body=0, mtp_head=0, lm_head=False)
    return Int8Arm.model_validate(
        {**_figures(Figures, ref_nll, per).to_json(), "vs_artifact": vs, "int32_overflows": 0, "int8_linears": none}
    )


def mtp_figures(cat: dict[str, dict[str, torch.Tensor]]) -> Mtp:
    """Pure: MTP t+2 agreement per arm (mean, t interval over windows, first-draft acceptance length),
    the change vs the reference, and the int4 vs bf16 MTP head on the same windows (paired, in points,
    and the share of positions where both heads draft the same token)."""
    keys = {"reference": "mtp_agree", "artifact": "mtp_agree", "artifact_bf16_mtp": "mtp_agree_bf16"}
    given: dict[str, MtpAgreement | MtpInt8 | Int4VsBf16 | float] = {}
    for name, key in keys.items():
        src = cat["artifact" if name == "artifact_bf16_mtp" else name]
        if key in src:
            given[name] = metrics.mtp_agreement(src[key])
    ref, art = given.get("reference"), given.get("artifact")
    if isinstance(ref, MtpAgreement) and isinstance(art, MtpAgreement):
        given["change_pct"] = 100 * (art.acceptance_length_1 / ref.acceptance_length_1 - 1)
    if "mtp_agree" in cat.get(INT8_ARM, {}) and "artifact" in given:  # int8 activations: paired with the artifact
        delta, dci = metrics.mean_ci95(cat[INT8_ARM]["mtp_agree"] - cat["artifact"]["mtp_agree"])
        given["int8"] = MtpInt8(
            **metrics.mtp_agreement(cat[INT8_ARM]["mtp_agree"]).given(),
            vs_artifact_points=100 * delta,
            vs_artifact_ci95_points=(100 * dci[0], 100 * dci[1]),
        )
    if "artifact_bf16_mtp" in given:
        delta, ci = metrics.mean_ci95(cat["artifact"]["mtp_agree"] - cat["artifact"]["mtp_agree_bf16"])
        drafts = cat["artifact"].get("mtp_same_draft")  # how often the two heads draft the very same token
        same = {} if drafts is None else {"same_draft": float(drafts.mean())}
        given["int4_vs_bf16"] = Int4VsBf16(delta_points=100 * delta, ci95_points=(100 * ci[0], 100 * ci[1]), **same)
    return Mtp.model_validate(given)


# Above this many bytes of source weights eval streams one decoder layer at a time (evaluate/streamed.py):
# the dense path holds both arms whole, in float32 (4x the bf16 bytes, twice).
STREAM_ABOVE_BYTES = 2 * 10**9


def weight_bytes(folder: Path) -> int:
    """Total size of a folder's *.safetensors files."""
    return sum(p.stat().st_size for p in Path(folder).glob("*.safetensors"))


def int8_dense_arm(
    raw: dict[str, torch.Tensor],
    config: dict[str, Any],
    tensors: dict[str, torch.Tensor],
    head: torch.Tensor,
    device: str,
) -> tuple[Int8Run, list[Any], Int8Linears]:
    """(the int8-activation arm, its int8 Linears, their counts) from the artifact's stored tensors `raw` and
    `config`, and its dequantized `tensors`: the dense forward with every int4 Linear (body, lm_head, MTP head)
    replaced by vLLM's int8-activation arithmetic; bf16 Linears stay as they are."""
    from qwenquant.evaluate.int8act import int8_counts, int8_modules, swap_linears

    mods = int8_modules(raw, config)
    fwd = DenseForward(text_config(config), tensors, device)
    # the MTP head's Linears are fwd.mtp's; the lm_head runs apart (the arm's head below)
    body = {name: m for name, m in mods.items() if not name.startswith("mtp.") and name != "lm_head"}
    swapped = swap_linears(fwd.model, body) + (
        swap_linears(fwd.mtp, mods, prefix="mtp.") if fwd.mtp is not None else []
    )
    lm = mods.get("lm_head")
    if lm is not None:
        lm.to(device)
    log.info(
        "eval: int8 activations on %d int4 Linears (%s)",
        len(swapped) + (lm is not None),
        "lm_head included" if lm is not None else "the lm_head is not int4",
    )
    return (
        (fwd, lm if lm is not None else (lambda h: h @ head.T)),
        [*mods.values()],
        int8_counts(swapped, lm is not None),
    )


@dataclass
class Forwards:
    """What the measurement runs: both forwards, the heads (reference, rtn, artifact), the batch size, and with
    int8 activations the int8 arm, its int32 overflow count (read after the run) and its int8 Linears' counts."""

    ref: TextForward
    art: TextForward
    heads: dict[str, torch.Tensor]
    batch: int
    int8: Int8Run | None = None
    overflows: Callable[[], int] = lambda: 0
    int8_linears: Int8Linears | None = None


def streamed_arms(reference: Path, artifact: Path, windows: torch.Tensor, device: str, activations: str) -> Forwards:
    """The arms one decoder layer at a time from the shards (batch 1: a window's logits over a 248k vocabulary
    are 0.25 GB, and the KL holds a few such)."""
    from qwenquant.evaluate.longwindow import memory_line
    from qwenquant.evaluate.streamed import streamed_forwards

    log.info(
        "eval: %s",
        memory_line(
            text_config(read_config(reference)),
            int(windows.shape[1]),
            int(windows.shape[0]),
            arms=3 if activations == "int8" else 2,
        ),
    )
    ref, art, heads, extra = streamed_forwards(reference, artifact, windows, device=device, int8=activations == "int8")
    arms = Forwards(ref, art, heads, batch=1)
    if extra is not None:
        arms.int8, arms.overflows, arms.int8_linears = (extra[0], extra[1]), extra[2].flush, extra[2].counts
    return arms


def dense_arms(reference: Path, artifact: Path, device: str, activations: str, batch: int) -> Forwards:
    """The arms over dense float weights on `device`."""
    ref_cfg, ref_t = load_dense(reference)
    art_config, art_raw = read_config(artifact), raw_tensors(artifact)  # read once: the int8 arm needs the codes
    art_cfg, art_t = text_config(art_config), dequantize(art_raw, art_config)
    heads = {
        "reference": ref_t["lm_head.weight"],
        "rtn": rtn_head(ref_t["lm_head.weight"]),
        "artifact": art_t["lm_head.weight"],
    }
    heads = {k: v.float().to(device) for k, v in heads.items()}
    arms = Forwards(DenseForward(ref_cfg, ref_t, device), DenseForward(art_cfg, art_t, device), heads, batch=batch)
    if activations == "int8":
        arms.int8, mods, arms.int8_linears = int8_dense_arm(art_raw, art_config, art_t, heads["artifact"], device)
        arms.overflows = lambda: sum(m.overflows for m in mods)
    return arms


def run_offline(
    reference: Path,
    artifact: Path,
    windows: torch.Tensor,
    *,
    device: str = "cpu",
    batch: int = 8,
    streamed: bool | None = None,
    activations: str = "bf16",
) -> OfflineRun:
    """Evaluate `artifact` against `reference` on `windows` [N, L]: dense float weights on `device`,
    or (`streamed`, default above STREAM_ABOVE_BYTES) one decoder layer at a time from the shards.
    `activations="int8"` adds the arm that runs the artifact as vLLM's int8-activation path (in either forward)."""
    start = time.monotonic()
    if streamed is None:
        streamed = weight_bytes(reference) > STREAM_ABOVE_BYTES
    arms = (
        streamed_arms(reference, artifact, windows, device, activations)
        if streamed
        else dense_arms(reference, artifact, device, activations, batch)
    )
    # the text the largest per-token KL rests on: up to 16 tokens of context and the token predicted
    figures = evaluate_forwards(arms, windows, lambda w, t: window_text(reference, windows[w, max(0, t - 15) : t + 2]))
    return OfflineRun(
        **dict(figures),
        windows=int(windows.shape[0]),
        window_len=int(windows.shape[1]),
        device=device,
        forward="streamed" if streamed else "dense",
        seconds=round(time.monotonic() - start, 1),
        activations=activations,
    )
