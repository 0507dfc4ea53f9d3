"""Build one checkpoint folder from the previous stage's folder, touching only what changes.

Stages never edit a folder in place: each writes a new folder (inside a staging dir) whose shards
are hard links to the previous stage's files when their tensors are unchanged, and freshly
written (deterministically, see tensorfile) when not. Side files are linked the same way.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from qwenquant.atomic import atomic_write_bytes, pretty_json
from qwenquant.checkpoint.config import CONFIG_NAME, read_weight_map
from qwenquant.checkpoint.header import INDEX_NAME
from qwenquant.checkpoint.tensorfile import RawTensor, TensorRef, checkpoint_refs, shard_refs, write_index, write_shard

Ref = RawTensor | TensorRef
ShardPlan = dict[str, dict[str, Ref]]


def link_or_copy(src: Path, dst: Path) -> None:
    """Hard-link `src` to `dst` (files are never modified in place), copying across devices."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.exists():
        dst.unlink()
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def weight_map(folder: Path) -> dict[str, str]:
    """tensor name -> shard file name, from the index (or from the shards when there is none)."""
    mapped = read_weight_map(folder)
    if mapped is not None:
        return mapped
    out: dict[str, str] = {}
    for shard in sorted(Path(folder).glob("*.safetensors")):
        for n in shard_refs(shard):
            out[n] = shard.name
    return out


def current_plan(folder: Path) -> ShardPlan:
    """The folder's tensors grouped by shard, as a plan that reproduces it unchanged."""
    refs = checkpoint_refs(folder)
    plan: ShardPlan = {}
    for name, shard in weight_map(folder).items():
        plan.setdefault(shard, {})[name] = refs[name]
    return plan


def _unchanged(src: Path, tensors: Mapping[str, Ref]) -> bool:
    if not src.is_file():
        return False
    if any(not isinstance(r, TensorRef) or r.path != src or r.name != n for n, r in tensors.items()):
        return False
    return set(shard_refs(src)) == set(tensors)


def write_plan(prev_dir: Path, out_dir: Path, plan: ShardPlan) -> dict[str, str]:
    """Write (or link) every shard of `plan` into `out_dir` and write the index; return the weight map."""
    weight: dict[str, str] = {}
    total = 0
    for shard in sorted(plan):
        tensors = plan[shard]
        if not tensors:
            continue
        src = Path(prev_dir) / shard
        if Path(out_dir).resolve() == Path(prev_dir).resolve():
            raise ValueError("write_plan needs a fresh output folder")
        if _unchanged(src, tensors):
            link_or_copy(src, Path(out_dir) / shard)
        else:
            write_shard(Path(out_dir) / shard, [dataclasses.replace(r, name=n) for n, r in tensors.items()])
        for n, r in tensors.items():
            weight[n] = shard
            total += r.nbytes
    write_index(out_dir, weight, total)
    return weight


def carry_files(prev_dir: Path, out_dir: Path, *, drop: Iterable[str] = ()) -> list[str]:
    """Link every non-tensor file of `prev_dir` (except the index, config and `drop`) into `out_dir`."""
    skip = set(drop) | {INDEX_NAME, CONFIG_NAME}
    carried = []
    for p in sorted(Path(prev_dir).iterdir()):
        if p.is_file() and not p.name.startswith(".") and p.suffix != ".safetensors" and p.name not in skip:
            link_or_copy(p, Path(out_dir) / p.name)
            carried.append(p.name)
    return carried


def derive_checkpoint(
    prev_dir: Path, out_dir: Path, plan: ShardPlan, config: dict[str, Any], *, drop_files: Iterable[str] = ()
) -> None:
    """`out_dir` := `prev_dir` with the tensors of `plan`, this config, side files minus `drop_files`."""
    write_plan(prev_dir, out_dir, plan)
    carry_files(prev_dir, out_dir, drop=drop_files)
    atomic_write_bytes(Path(out_dir) / "config.json", pretty_json(config))


def torch_raw(name: str, t: Any, *, copy: bool = True) -> RawTensor:
    """A torch tensor as a RawTensor (exact bytes, little-endian, safetensors dtype name).

    `copy=False`: the RawTensor reads the tensor's own memory (no second host copy of a large
    tensor); the tensor must not change until it is written."""
    import torch

    names = {
        torch.int32: "I32",
        torch.int64: "I64",
        torch.bfloat16: "BF16",
        torch.float16: "F16",
        torch.float32: "F32",
        torch.int8: "I8",
        torch.uint8: "U8",
    }
    t = t.detach().contiguous().cpu()
    if not t.numel():
        data: bytes | memoryview = b""
    else:
        raw = t.reshape(-1).view(torch.uint8).numpy()
        data = raw.tobytes() if copy else memoryview(raw)
    return RawTensor(name, names[t.dtype], tuple(t.shape), data)


def map_plan(plan: ShardPlan, fn: Callable[[str], str | None]) -> ShardPlan:
    """Rename tensors (None drops one), keeping each in its shard."""
    out: ShardPlan = {}
    for shard, tensors in plan.items():
        kept = {new: r for n, r in tensors.items() if (new := fn(n)) is not None}
        if kept:
            out[shard] = kept
    return out
