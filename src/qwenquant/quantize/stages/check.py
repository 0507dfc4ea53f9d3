"""Check stage: the finished checkpoint passes vLLM's load rules and the byte-identity proofs.

Three proofs, all reading headers and raw bytes (no torch): every tensor the recipe does not
quantize is byte-identical to the source (checkpoint/identity.py), every MTP tensor is
(stages/mtp.py), and `qwenquant.check` finds nothing vLLM would refuse. Any problem fails the build.
Tensor digests come from the run's cache (hashing.DigestCache): a tensor whose file version and
byte range an earlier stage (or the first proof) hashed in this run is not read again.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from qwenquant.atomic import atomic_write_json
from qwenquant.errors import CheckError
from qwenquant.quantize.stage import Stage, StageContext

if TYPE_CHECKING:
    from qwenquant.hashing import DigestCache
    from qwenquant.recipe import QuantizationSpec


def unquantized_problems(
    artifact: Path,
    source: Path,
    quantization: QuantizationSpec,
    *,
    head_quantized: bool,
    layout: str,
    mtp_quantized: bool = False,
    digests: DigestCache | None = None,
) -> list[str]:
    """The byte-identity proof for a finished artifact (text-only names mapped back to the source;
    `digests`: the run's cache, or None to read every tensor)."""
    from qwenquant.checkpoint.identity import prove_unquantized_identical, recipe_quantizes
    from qwenquant.quantize.stages.textonly import text_only_name

    return prove_unquantized_identical(
        artifact,
        source,
        rename=text_only_name if layout == "text-only" else (lambda n: n),
        may_quantize=recipe_quantizes(
            list(quantization.ignore), head_quantized=head_quantized, mtp_quantized=mtp_quantized
        ),
        digests=digests,
    )


def _run(ctx: StageContext, out_dir: Path) -> dict[str, Any]:
    from qwenquant.check import check_artifact, mtp_vllm_problems
    from qwenquant.quantize.stages.mtp import packed_mtp, verify_mtp

    artifact, recipe = ctx.dir("textonly"), ctx.recipe
    problems = [
        f"unquantized-identical: {p}"
        for p in unquantized_problems(
            artifact,
            ctx.source,
            recipe.quantization,
            head_quantized=recipe.lm_head.enabled,
            layout=recipe.artifact.layout,
            mtp_quantized=recipe.mtp_quantized,
            digests=ctx.digests,
        )
    ]
    # the run's digests: the tensors the proof above (and earlier stages) hashed are not read again
    problems += [f"mtp-identical: {p}" for p in verify_mtp(artifact, ctx.source, packed_mtp(ctx), ctx.digests)]
    problems += [f"mtp-vllm: {p}" for p in mtp_vllm_problems(recipe)]
    report = check_artifact(artifact)
    rules: list[str] = []
    for p in report.findings:
        problems.append(str(p))
        rules.append(p.rule)
    atomic_write_json(
        out_dir / "check.json",
        {
            "problems": problems,
            "failed_rules": sorted(set(rules)),
            "rules_run": list(report.rules_run) + ["unquantized-identical", "mtp-identical"],
        },
    )
    if problems:
        ids = sorted(set(rules) | {p.split(":", 1)[0] for p in problems if p.startswith(("unquantized-", "mtp-"))})
        raise CheckError(
            f"the artifact fails {len(problems)} check(s) [{', '.join(ids)}]:\n  " + "\n  ".join(problems[:20]),
            hint="fix the cause and re-run `qwenquant quantize` (finished stages are reused)",
        )
    return {"problems": 0}


def _inputs(ctx: StageContext) -> dict[str, str]:
    return {"textonly": ctx.digest("textonly"), "source": ctx.digest("source"), "recipe": ctx.recipe.sha256()}


def _same_outputs(ctx: StageContext, record: dict[str, Any]) -> str | None:
    """Why a run writes the check.json of `record` (for `--plan`), or None: the checkpoint and the source
    are the ones it checked and its layout the same. What a passing check writes depends on them alone
    (the recipe's other parts can only add problems, and a problem stops the build), so a recipe that
    differs elsewhere (a serve profile) re-runs the check and leaves the stages after it reused."""
    now, then = _inputs(ctx), record["inputs"]
    if (then.get("textonly"), then.get("source")) != (now["textonly"], now["source"]) or record["params"] != {
        "layout": ctx.recipe.artifact.layout
    }:
        return None
    return "the same checkpoint and source: a check that passes writes the same check.json"


STAGE = Stage("check", _inputs, lambda ctx: {"layout": ctx.recipe.artifact.layout}, _run, same_outputs=_same_outputs)
