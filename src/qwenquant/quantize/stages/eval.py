"""Eval stage (after check): the quick eval a recipe asks for with `eval: {windows, window_len}`.

The finished checkpoint (the textonly stage's folder) against the source, paired on fixed windows,
through `qwenquant eval`'s own code (evaluate/offline.py): perplexity delta with its 95% CI, KL,
top-1, the head alone (round-to-nearest vs calibrated) and MTP agreement. The figures go into the
manifest's `quality` section (and qwenquant-quality.json). Without the key the stage records
`{"eval": null}` and does nothing. Windows: the recipe's `text` (auto: the tiny reference's
shipped held-out text for it, the pinned Hub text set for other models, fetched into
`<work>/datasets/`).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qwenquant.atomic import atomic_write_json
from qwenquant.hashing import sha256_json
from qwenquant.modeling.runtime import set_deterministic, thread_fields
from qwenquant.quantize.stage import Stage, StageContext

if TYPE_CHECKING:
    from qwenquant.evaluate.reportparts import OfflineRun, TextSource

log = logging.getLogger(__name__)

# The figures the manifest keeps: small, deterministic for a given machine type (no timings).
_ARM_KEYS = ("ppl", "delta_pct", "ci95_pct", "windows_worse", "windows", "kl", "kl_ci95", "kl_p99", "kl_p999", "top1")


def quality_section(run: OfflineRun, source: TextSource) -> dict[str, Any]:
    """Pure: what the manifest records of an offline eval run."""
    from qwenquant.evaluate.report import goals

    arms: dict[str, Any] = {"reference": {"ppl": run.arms.reference.ppl}}
    for name, arm in run.arms.compared():
        figures = arm.to_json()
        arms[name] = {k: figures[k] for k in _ARM_KEYS}
    head = run.lm_head
    return {
        "windows": run.windows,
        "window_len": run.window_len,
        **source.to_json(),
        "arms": arms,
        "lm_head": {
            "rtn_kl": head.rtn.kl,
            "calibrated_kl": head.gptq.kl,
            "ratio": head.ratio,
            "rtn_top1": head.rtn.top1,
            "calibrated_top1": head.gptq.top1,
        },
        "mtp": run.mtp.to_json(),
        "goals": goals(run).to_json(),
    }


def _run(ctx: StageContext, out_dir: Path) -> dict[str, Any]:
    spec = ctx.recipe.eval
    if spec is None:
        return {"eval": None}
    from qwenquant.evaluate.offline import run_offline
    from qwenquant.evaluate.texts import resolve_windows

    set_deterministic()  # the thread count its inputs record, also when eval is the only stage a resumed run has left
    start = time.monotonic()
    ids, source = resolve_windows(
        ctx.source, spec.windows, spec.window_len, text_set=spec.text, cache=ctx.work / "datasets"
    )
    run = run_offline(ctx.source, ctx.dir("textonly"), ids, device=ctx.device, batch=spec.batch)
    section = quality_section(run, source)
    atomic_write_json(out_dir / "eval.json", section)
    a = section["arms"]["artifact"]
    log.info(
        "quick eval (%d x %d tokens, %.0f s): perplexity %+.2f%% [%+.2f, %+.2f] vs bf16, KL %.5f, top-1 %.2f%%",
        spec.windows,
        spec.window_len,
        time.monotonic() - start,
        a["delta_pct"],
        *a["ci95_pct"],
        a["kl"],
        100 * a["top1"],
    )
    return {"eval": section}


def _inputs(ctx: StageContext) -> dict[str, str]:
    spec = ctx.recipe.eval
    return {
        "textonly": ctx.digest("textonly"),
        "check": ctx.digest("check"),
        "source": ctx.digest("source"),
        "device": ctx.device,
        **thread_fields(ctx.device),
        "eval": sha256_json(spec.model_dump(mode="json") if spec else None),
    }


def _manifest(outcome: Any) -> dict[str, Any]:
    """The figures go into the manifest's quality section; without the `eval:` key nothing does,
    so such artifacts keep their digests."""
    figures = outcome.result.get("eval")
    return {} if figures is None else {"quality": {"eval": figures}}


STAGE = Stage(
    "eval",
    _inputs,
    lambda ctx: {"eval": ctx.recipe.eval.model_dump(mode="json") if ctx.recipe.eval else None},
    _run,
    manifest=_manifest,
    idle=lambda result: result.get("eval") is None,
)
