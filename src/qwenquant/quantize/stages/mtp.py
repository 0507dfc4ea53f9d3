"""MTP draft head: the 15 bf16 `mtp.*` tensors, byte-identical to the source, ignored by quantization,
or (`mtp: {quantize: gptq}`) its Linears int4-packed by the gptq stage and the rest from the source.

transformers drops `mtp.*` on load, so a quantized save does not have them from the model; this
stage (and `qwenquant graft-mtp`) puts them back: the source bytes, and for a quantized head the
packed Linears the streamed gptq stage left in `mtp-gptq/` (engine/mtpcal.py) in place of their bf16
weights. `plan_graft` is pure: it compares tensor digests and the index; `graft_into` writes the MTP
shard, the index and the config (`re:^mtp.*` in quantization_config.ignore for a bf16 head only).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qwenquant.atomic import atomic_write_bytes, pretty_json
from qwenquant.checkpoint.assemble import ShardPlan, carry_files, weight_map, write_plan
from qwenquant.checkpoint.config import read_config
from qwenquant.checkpoint.identity import TensorDigest, quantized_module, tensor_digests
from qwenquant.checkpoint.names import MTP_IGNORE, MTP_PREFIX, targets_cover
from qwenquant.checkpoint.tensorfile import TensorRef, checkpoint_refs, shard_refs
from qwenquant.errors import StageError
from qwenquant.hashing import DigestCache
from qwenquant.quantize.stage import Stage, StageContext

MTP_SHARD = "model-mtp.safetensors"


@dataclass(frozen=True)
class GraftPlan:
    """What `apply_graft` must change; empty tuples and False flags mean nothing to graft."""

    add: tuple[str, ...]  # in the source, missing from the artifact
    replace: tuple[str, ...]  # in both, but dtype, shape or bytes differ
    remove: tuple[str, ...]  # mtp.* in the artifact that the source does not have
    move: tuple[str, ...]  # identical, but not in the MTP shard
    index_fix: tuple[str, ...]  # weight map entries missing or pointing elsewhere
    ignore_fix: bool  # `re:^mtp.*` missing from quantization_config.ignore (present, for an int4 head)
    quantized: bool = False  # the head's Linears are int4-packed (mtp.quantize: gptq)

    @property
    def nothing_to_do(self) -> bool:
        return not (self.add or self.replace or self.remove or self.move or self.index_fix or self.ignore_fix)

    def summary(self) -> str:
        if self.nothing_to_do:
            return "nothing to graft"
        parts = [
            f"{k} {len(v)}"
            for k, v in (
                ("add", self.add),
                ("replace", self.replace),
                ("remove", self.remove),
                ("move", self.move),
                ("index", self.index_fix),
            )
            if v
        ]
        if self.ignore_fix:
            parts.append(
                "remove re:^mtp.* from quantization_config.ignore"
                if self.quantized
                else "add re:^mtp.* to quantization_config.ignore"
            )
        return ", ".join(parts)


def plan_graft(
    artifact_index: Mapping[str, str],
    artifact_headers: Mapping[str, TensorDigest],
    source_tensors: Mapping[str, TensorDigest],
    *,
    ignore: list[str] | None = None,
    has_quant_config: bool = True,
    quantized: bool = False,
) -> GraftPlan:
    """Pure: compare the artifact's mtp tensors (index + digests) with what they must be
    (`source_tensors`: the source's, with the packed Linears in place of their weights when
    `quantized`; then the ignore list must leave the head to the body's config group)."""
    src = {n: d for n, d in source_tensors.items() if n.startswith(MTP_PREFIX)}
    art = {n: d for n, d in artifact_headers.items() if n.startswith(MTP_PREFIX)}
    if not src:
        raise StageError(
            "the source checkpoint has no mtp.* tensors", hint="check --source points at the original model"
        )
    add = tuple(sorted(set(src) - set(art)))
    replace = tuple(sorted(n for n in set(src) & set(art) if art[n] != src[n]))
    remove = tuple(sorted(set(art) - set(src)))
    move = tuple(
        sorted(n for n in set(src) & set(art) if art[n] == src[n] and artifact_index.get(n) not in (None, MTP_SHARD))
    )
    index_fix = tuple(sorted(n for n in src if n in art and artifact_index.get(n) is None))
    if quantized:
        ignore_fix = has_quant_config and targets_cover(ignore or [], "mtp.fc")
    else:
        ignore_fix = has_quant_config and MTP_IGNORE not in (ignore or [])
    return GraftPlan(add, replace, remove, move, index_fix, ignore_fix, quantized)


def expected_mtp(source_refs: Mapping[str, TensorRef], packed: Mapping[str, TensorRef] | None) -> dict[str, TensorRef]:
    """Pure: the mtp.* tensors an artifact must hold: the source's, each packed module's `.weight`
    replaced by its packed tensors (`packed`: None for a bf16 head)."""
    src = {n: r for n, r in source_refs.items() if n.startswith(MTP_PREFIX)}
    if not packed:
        return src
    mods = {quantized_module(n) for n in packed} - {None}
    out = {n: r for n, r in src.items() if n[: -len(".weight")] not in mods or not n.endswith(".weight")}
    out.update(packed)
    return out


def _quant_ignore(config: dict[str, Any]) -> tuple[bool, list[str]]:
    qc = config.get("quantization_config")
    return (qc is not None), list((qc or {}).get("ignore") or [])


def present_refs(folder: Path) -> tuple[dict[str, str], dict[str, Any]]:
    """(weight map, refs of every tensor in the mapped shards) leaving out index entries of a missing
    shard that held only mtp.* tensors (the MTP shard deleted: what graft-mtp restores)."""
    folder = Path(folder)
    wmap = weight_map(folder)
    missing = {s for s in set(wmap.values()) if not (folder / s).is_file()}
    for name, shard in sorted(wmap.items()):
        if shard in missing and not name.startswith(MTP_PREFIX):
            raise StageError(
                f"{folder / shard} is missing and held {name}, not only the MTP head",
                hint="graft-mtp restores only mtp.* tensors; re-run `qwenquant quantize`",
            )
    refs: dict[str, Any] = {}
    for shard in sorted(set(wmap.values()) - missing):
        refs.update(shard_refs(folder / shard))
    return {n: s for n, s in wmap.items() if s not in missing}, refs


def present_plan(folder: Path) -> ShardPlan:
    """The folder's tensors by shard, as `current_plan` reads them, without a missing MTP-only shard."""
    wmap, refs = present_refs(folder)
    plan: ShardPlan = {}
    for name, shard in wmap.items():
        if name not in refs:
            raise StageError(
                f"{folder}: the index maps {name} to {shard}, which does not hold it",
                hint="the folder is damaged; re-run `qwenquant quantize`",
            )
        plan.setdefault(shard, {})[name] = refs[name]
    return plan


def plan_for(
    artifact_dir: Path,
    source_dir: Path,
    packed: Mapping[str, TensorRef] | None = None,
    digests: DigestCache | None = None,
) -> GraftPlan:
    """Read digests and the index of both folders and plan the graft (`packed`: an int4 head's
    packed Linears, name -> tensor, see `expected_mtp`; `digests`: the run's cache, or None)."""
    index, art_refs = present_refs(artifact_dir)
    want = expected_mtp(checkpoint_refs(source_dir), packed)
    art = tensor_digests(art_refs, [n for n in art_refs if n.startswith(MTP_PREFIX)], digests)
    has_qc, ignore = _quant_ignore(read_config(artifact_dir))
    return plan_graft(
        index,
        art,
        tensor_digests(want, digests=digests),
        ignore=ignore,
        has_quant_config=has_qc,
        quantized=bool(packed),
    )


def graft_into(
    folder: Path, out_dir: Path, source_dir: Path, plan: GraftPlan, packed: Mapping[str, TensorRef] | None = None
) -> None:
    """Write `folder`'s tensors + the MTP tensors (`expected_mtp`) into the fresh folder `out_dir`, with
    the index and config (side files are the caller's). Every mtp tensor goes to `model-mtp.safetensors`."""
    shard_plan = present_plan(folder)
    for shard in list(shard_plan):
        shard_plan[shard] = {n: r for n, r in shard_plan[shard].items() if not n.startswith(MTP_PREFIX)}
    shard_plan[MTP_SHARD] = dict(expected_mtp(checkpoint_refs(source_dir), packed))
    write_plan(folder, out_dir, shard_plan)
    config = read_config(folder)
    qc = config.get("quantization_config")
    if qc is not None:
        ignore = list(qc.get("ignore") or [])
        if packed:  # the body's `Linear` group covers the head's Linears: nothing may ignore them
            qc["ignore"] = [e for e in ignore if not targets_cover([e], "mtp.fc")]
        elif MTP_IGNORE not in ignore:
            qc["ignore"] = ignore + [MTP_IGNORE]
    atomic_write_bytes(Path(out_dir) / "config.json", pretty_json(config))


def verify_mtp(
    artifact_dir: Path,
    source_dir: Path,
    packed: Mapping[str, TensorRef] | None = None,
    digests: DigestCache | None = None,
) -> list[str]:
    """Problems (empty = fine): every mtp tensor the artifact must hold (`expected_mtp`) byte-identical
    in it, and the ignore list as the head's precision needs (`digests`: the run's cache, or None)."""
    plan = plan_for(artifact_dir, source_dir, packed, digests)
    problems = [f"{n}: missing" for n in plan.add] + [f"{n}: differs from the source" for n in plan.replace]
    problems += [f"{n}: not in the source" for n in plan.remove] + [f"{n}: not in the index" for n in plan.index_fix]
    if plan.ignore_fix:
        problems.append(
            "quantization_config.ignore covers the int4 MTP head (vLLM would build it bf16, vLLM #53387)"
            if plan.quantized
            else "quantization_config.ignore lacks re:^mtp.*"
        )
    return problems


def packed_mtp(ctx: StageContext) -> dict[str, TensorRef] | None:
    """The packed MTP Linears the gptq stage left for a recipe with `mtp: {quantize: gptq}`, else None."""
    if not ctx.recipe.mtp_quantized:
        return None
    from qwenquant.quantize.engine import mtpcal

    packed = mtpcal.load_refs(ctx.dir("gptq"))
    if not packed:
        raise StageError(
            "mtp.quantize is gptq but the gptq stage left no quantized MTP head",
            hint="re-run `qwenquant quantize` with a fresh --work folder (streamed engine)",
        )
    return packed


def _run(ctx: StageContext, out_dir: Path) -> dict[str, Any]:
    prev = ctx.dir("lm_head")
    packed = packed_mtp(ctx)
    plan = plan_for(prev, ctx.source, packed, ctx.digests)
    graft_into(prev, out_dir, ctx.source, plan, packed)
    carry_files(prev, out_dir)
    out: dict[str, Any] = {"graft": plan.summary(), "added": len(plan.add)}
    if packed:
        out["quantized_modules"] = len({quantized_module(n) for n in packed})
    return out


def _inputs(ctx: StageContext) -> dict[str, str]:
    out = {"source": ctx.digest("source"), "lm_head": ctx.digest("lm_head")}
    if ctx.recipe.mtp_quantized:  # the packed head comes from the gptq stage folder
        out["gptq"] = ctx.digest("gptq")
    return out


STAGE = Stage(
    "mtp", _inputs, lambda ctx: {"mtp": "gptq"} if ctx.recipe.mtp_quantized else {}, _run, builds_checkpoint=True
)
