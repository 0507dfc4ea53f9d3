"""Raw safetensors shards: read tensors as bytes, write shards deterministically.

Stages move tensors between checkpoints without ever decoding them, so a tensor that is not
quantized keeps its exact bytes, dtype and shape. Writes are deterministic: tensors sorted by
name, fixed `{"format": "pt"}` metadata, header padded with spaces to 8 bytes.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from qwenquant.atomic import atomic_write_bytes, atomic_writer, pretty_json
from qwenquant.checkpoint.config import read_weight_map
from qwenquant.checkpoint.header import INDEX_NAME, SafetensorsHeader, read_header


@dataclass(frozen=True)
class TensorSpec:
    """A tensor a model architecture declares: name, shape and kind ("linear" for the weight of an
    nn.Linear, a quantization candidate; otherwise what initializes it: "offset", "scale", "conv", ...)."""

    name: str
    shape: tuple[int, ...]
    kind: str

    @property
    def linear(self) -> bool:
        return self.kind == "linear"


@dataclass(frozen=True)
class TensorRef:
    """Where one tensor's bytes live: file, byte range (absolute), dtype, shape."""

    name: str
    path: Path
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start

    def read(self) -> bytes:
        with open(self.path, "rb") as f:
            f.seek(self.start)
            return f.read(self.end - self.start)

    def read_bytearray(self) -> bytearray:
        """The bytes in a writable buffer (torch.frombuffer without an extra copy of a big tensor)."""
        buf = bytearray(self.nbytes)
        with open(self.path, "rb") as f:
            f.seek(self.start)
            f.readinto(buf)
        return buf


@dataclass(frozen=True)
class RawTensor:
    """A tensor as bytes in memory (for tensors produced by a stage, e.g. a packed head)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    data: bytes | memoryview  # a memoryview: flat, one byte per item

    @property
    def nbytes(self) -> int:
        return len(self.data)

    def read(self) -> bytes | memoryview:
        return self.data


def header_refs(path: Path, h: SafetensorsHeader) -> dict[str, TensorRef]:
    """Every tensor a header (already read from `path`) describes, by name, with absolute offsets."""
    base = 8 + h.header_bytes
    return {
        n: TensorRef(n, Path(path), t.dtype, tuple(t.shape), base + t.start, base + t.end) for n, t in h.tensors.items()
    }


def shard_refs(path: Path) -> dict[str, TensorRef]:
    """Every tensor of one safetensors file, by name."""
    return header_refs(path, read_header(Path(path)))


def checkpoint_shards(folder: Path) -> list[Path]:
    """The safetensors files of a checkpoint: those named by its index, else every *.safetensors."""
    folder = Path(folder)
    mapped = read_weight_map(folder)
    if mapped is not None:
        return [folder / n for n in sorted(set(mapped.values()))]
    return sorted(folder.glob("*.safetensors"))


def checkpoint_refs(folder: Path) -> dict[str, TensorRef]:
    """Every tensor of a checkpoint folder, by name (index first, else all shards)."""
    refs: dict[str, TensorRef] = {}
    for shard in checkpoint_shards(folder):
        refs.update(shard_refs(shard))
    return refs


def header_bytes(tensors: Iterable[RawTensor | TensorRef]) -> bytes:
    """The safetensors header (length prefix included) for tensors written in name order."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for t in sorted(tensors, key=lambda t: t.name):
        header[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    raw = json.dumps(header, separators=(",", ":"), sort_keys=False).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


def write_shard(path: Path, tensors: Iterable[RawTensor | TensorRef]) -> None:
    """Write one shard (atomic: temp name, fsync, rename), streaming each tensor's bytes."""
    items = sorted(tensors, key=lambda t: t.name)
    with atomic_writer(Path(path)) as f:
        f.write(header_bytes(items))
        for t in items:
            f.write(t.read())


def plan_shards(
    tensors: Mapping[str, RawTensor | TensorRef], max_shard_bytes: int, separate: Mapping[str, str] | None = None
) -> dict[str, list[str]]:
    """Pure: file name -> tensor names. Names in `separate` go to their named shard; the rest are
    cut in name order into `model-0000i-of-0000N.safetensors` shards of at most `max_shard_bytes`."""
    separate = dict(separate or {})
    body = sorted(n for n in tensors if n not in separate)
    groups: list[list[str]] = []
    size = 0
    for n in body:
        nb = tensors[n].nbytes
        if not groups or (size + nb > max_shard_bytes and groups[-1]):
            groups.append([])
            size = 0
        groups[-1].append(n)
        size += nb
    plan: dict[str, list[str]] = {}
    if len(groups) == 1:
        plan["model.safetensors"] = groups[0]
    else:
        for i, g in enumerate(groups, 1):
            plan[f"model-{i:05d}-of-{len(groups):05d}.safetensors"] = g
    for n, shard in sorted(separate.items()):
        plan.setdefault(shard, []).append(n)
    return plan


def write_checkpoint_tensors(
    folder: Path,
    tensors: Mapping[str, RawTensor | TensorRef],
    max_shard_bytes: int,
    separate: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Write all shards and the index into `folder`; return the weight map."""
    folder = Path(folder)
    plan = plan_shards(tensors, max_shard_bytes, separate)
    weight_map: dict[str, str] = {}
    total = 0
    for shard, names in plan.items():
        write_shard(folder / shard, [tensors[n] for n in names])
        for n in names:
            weight_map[n] = shard
            total += tensors[n].nbytes
    write_index(folder, weight_map, total)
    return weight_map


def write_index(folder: Path, weight_map: Mapping[str, str], total_size: int) -> None:
    """The shard index: total tensor bytes and the sorted tensor name -> shard file map."""
    atomic_write_bytes(
        Path(folder) / INDEX_NAME,
        pretty_json({"metadata": {"total_size": int(total_size)}, "weight_map": dict(sorted(weight_map.items()))}),
    )
