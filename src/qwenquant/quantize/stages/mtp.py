"""MTP draft head: the 15 bf16 `mtp.*` tensors, byte-identical to the source, ignored by quantization.

transformers drops `mtp.*` on load, so a quantized save does not have them from the model; this
stage (and `qwenquant graft-mtp`) puts the source bytes back. `plan_graft` is pure: it compares
tensor digests and the index; `apply_graft` writes the MTP shard, the index and the config.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qwenquant.atomic import atomic_write_bytes, pretty_json
from qwenquant.checkpoint.assemble import ShardPlan, carry_files, weight_map, write_plan
from qwenquant.checkpoint.config import read_config
from qwenquant.checkpoint.identity import TensorDigest, tensor_digests
from qwenquant.checkpoint.names import MTP_IGNORE, MTP_PREFIX
from qwenquant.checkpoint.tensorfile import checkpoint_refs, shard_refs
from qwenquant.errors import StageError
from qwenquant.quantize.stage import Stage, StageContext

MTP_SHARD = "model-mtp.safetensors"


@dataclass(frozen=True)
class GraftPlan:
    """What `apply_graft` must change; empty tuples and False flags mean nothing to graft."""

    add: tuple[str, ...]          # in the source, missing from the artifact
    replace: tuple[str, ...]      # in both, but dtype, shape or bytes differ
    remove: tuple[str, ...]       # mtp.* in the artifact that the source does not have
    move: tuple[str, ...]         # identical, but not in the MTP shard
    index_fix: tuple[str, ...]    # weight map entries missing or pointing elsewhere
    ignore_fix: bool              # `re:^mtp.*` missing from quantization_config.ignore

    @property
    def nothing_to_do(self) -> bool:
        return not (self.add or self.replace or self.remove or self.move or self.index_fix or self.ignore_fix)

    def summary(self) -> str:
        if self.nothing_to_do:
            return "nothing to graft"
        parts = [f"{k} {len(v)}" for k, v in (("add", self.add), ("replace", self.replace), ("remove", self.remove),
                                               ("move", self.move), ("index", self.index_fix)) if v]
        if self.ignore_fix:
            parts.append("add re:^mtp.* to quantization_config.ignore")
        return ", ".join(parts)


def plan_graft(artifact_index: Mapping[str, str], artifact_headers: Mapping[str, TensorDigest],
               source_tensors: Mapping[str, TensorDigest], *, ignore: list[str] | None = None,
               has_quant_config: bool = True) -> GraftPlan:
    """Pure: compare the artifact's mtp tensors (index + digests) with the source's."""
    src = {n: d for n, d in source_tensors.items() if n.startswith(MTP_PREFIX)}
    art = {n: d for n, d in artifact_headers.items() if n.startswith(MTP_PREFIX)}
    if not src:
        raise StageError("the source checkpoint has no mtp.* tensors", hint="check --source points at the original model")
    add = tuple(sorted(set(src) - set(art)))
    replace = tuple(sorted(n for n in set(src) & set(art) if art[n] != src[n]))
    remove = tuple(sorted(set(art) - set(src)))
    move = tuple(sorted(n for n in set(src) & set(art)
                        if art[n] == src[n] and artifact_index.get(n) not in (None, MTP_SHARD)))
    index_fix = tuple(sorted(n for n in src if n in art and artifact_index.get(n) is None))
    ignore_fix = has_quant_config and MTP_IGNORE not in (ignore or [])
    return GraftPlan(add, replace, remove, move, index_fix, ignore_fix)


def _quant_ignore(config: dict[str, Any]) -> tuple[bool, list[str]]:
    qc = config.get("quantization_config")
    return (qc is not None), list((qc or {}).get("ignore") or [])


def _present(folder: Path) -> tuple[dict[str, str], dict[str, Any]]:
    """(weight map, refs of every tensor in the mapped shards) leaving out index entries of a missing
    shard that held only mtp.* tensors (the MTP shard deleted: what graft-mtp restores)."""
    folder = Path(folder)
    wmap = weight_map(folder)
    missing = {s for s in set(wmap.values()) if not (folder / s).is_file()}
    for name, shard in sorted(wmap.items()):
        if shard in missing and not name.startswith(MTP_PREFIX):
            raise StageError(f"{folder / shard} is missing and held {name}, not only the MTP head",
                             hint="graft-mtp restores only mtp.* tensors; re-run `qwenquant quantize`")
    refs: dict[str, Any] = {}
    for shard in sorted(set(wmap.values()) - missing):
        refs.update(shard_refs(folder / shard))
    return {n: s for n, s in wmap.items() if s not in missing}, refs


def present_plan(folder: Path) -> ShardPlan:
    """The folder's tensors by shard, as `current_plan` reads them, without a missing MTP-only shard."""
    wmap, refs = _present(folder)
    plan: ShardPlan = {}
    for name, shard in wmap.items():
        if name not in refs:
            raise StageError(f"{folder}: the index maps {name} to {shard}, which does not hold it",
                             hint="the folder is damaged; re-run `qwenquant quantize`")
        plan.setdefault(shard, {})[name] = refs[name]
    return plan


def plan_for(artifact_dir: Path, source_dir: Path) -> GraftPlan:
    """Read digests and the index of both folders and plan the graft."""
    index, art_refs = _present(artifact_dir)
    src_refs = checkpoint_refs(source_dir)
    art = tensor_digests(art_refs, [n for n in art_refs if n.startswith(MTP_PREFIX)])
    src = tensor_digests(src_refs, [n for n in src_refs if n.startswith(MTP_PREFIX)])
    has_qc, ignore = _quant_ignore(read_config(artifact_dir))
    return plan_graft(index, art, src, ignore=ignore, has_quant_config=has_qc)


def graft_into(folder: Path, out_dir: Path, source_dir: Path, plan: GraftPlan) -> None:
    """Write `folder`'s tensors + the source MTP tensors into the fresh folder `out_dir`, with the
    index and config (side files are the caller's). Every mtp tensor goes to `model-mtp.safetensors`."""
    src_refs = checkpoint_refs(source_dir)
    shard_plan = present_plan(folder)
    for shard in list(shard_plan):
        shard_plan[shard] = {n: r for n, r in shard_plan[shard].items() if not n.startswith(MTP_PREFIX)}
    shard_plan[MTP_SHARD] = {n: r for n, r in src_refs.items() if n.startswith(MTP_PREFIX)}
    write_plan(folder, out_dir, shard_plan)
    config = read_config(folder)
    qc = config.get("quantization_config")
    if qc is not None and MTP_IGNORE not in (qc.get("ignore") or []):
        qc["ignore"] = list(qc.get("ignore") or []) + [MTP_IGNORE]
    atomic_write_bytes(Path(out_dir) / "config.json", pretty_json(config))


def verify_mtp(artifact_dir: Path, source_dir: Path) -> list[str]:
    """Problems (empty = fine): every source mtp tensor byte-identical in the artifact and ignored."""
    plan = plan_for(artifact_dir, source_dir)
    problems = [f"{n}: missing" for n in plan.add] + [f"{n}: differs from the source" for n in plan.replace]
    problems += [f"{n}: not in the source" for n in plan.remove] + [f"{n}: not in the index" for n in plan.index_fix]
    if plan.ignore_fix:
        problems.append("quantization_config.ignore lacks re:^mtp.*")
    return problems


def _run(ctx: StageContext, out_dir: Path) -> dict[str, Any]:
    prev = ctx.dir("lm_head")
    plan = plan_for(prev, ctx.source)
    graft_into(prev, out_dir, ctx.source, plan)
    carry_files(prev, out_dir)
    return {"graft": plan.summary(), "added": len(plan.add)}


STAGE = Stage("mtp", lambda ctx: {"source": ctx.digest("source"), "lm_head": ctx.digest("lm_head")},
              lambda ctx: {}, _run, builds_checkpoint=True)
