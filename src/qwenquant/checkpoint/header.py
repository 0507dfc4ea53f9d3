"""Validate safetensors headers and the shard index without loading any tensor (pure, no torch).

A safetensors file is `u64 little-endian N`, then N bytes of JSON header, then the data area.
The header maps tensor names to `{dtype, shape, data_offsets: [start, end]}` (offsets relative
to the data area) plus an optional `__metadata__` of str -> str.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qwenquant.errors import QwenquantError

# The reference implementation refuses headers above 100 MB (safetensors MAX_HEADER_SIZE).
MAX_HEADER_BYTES = 100_000_000

DTYPE_BYTES: dict[str, int] = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8,
}  # fmt: skip

INDEX_NAME = "model.safetensors.index.json"


class SafetensorsError(QwenquantError):
    """A safetensors file or index is malformed; `problems` lists every rule it breaks."""

    exit_code = 3

    def __init__(self, message: str, problems: list[str], hint: str | None = None) -> None:
        super().__init__(message, hint)
        self.problems = problems

    def __str__(self) -> str:
        return f"{self.message}: " + "; ".join(self.problems)


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int


@dataclass(frozen=True)
class SafetensorsHeader:
    header_bytes: int
    data_bytes: int
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str] | None


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for k, v in pairs:
        if k in seen:
            raise _DuplicateKey(k)
        seen[k] = v
    return seen


class _DuplicateKey(ValueError):
    pass


def header_length(prefix: bytes, file_size: int) -> int:
    """Read and bound the header length N from the first 8 bytes; raise on a bad value."""
    if len(prefix) < 8 or file_size < 8:
        raise SafetensorsError("not a safetensors file", [f"file has {file_size} bytes, fewer than the 8-byte length"])
    (n,) = struct.unpack("<Q", prefix[:8])
    problems = []
    if n > MAX_HEADER_BYTES:
        problems.append(f"header length {n} exceeds the {MAX_HEADER_BYTES}-byte limit")
    if 8 + n > file_size:
        problems.append(f"header length {n} runs past the end of the {file_size}-byte file")
    if n < 2:
        problems.append(f"header length {n} is too small for a JSON object")
    if problems:
        raise SafetensorsError("bad safetensors header", problems)
    return n


def parse_header(header_json: bytes, file_size: int) -> SafetensorsHeader:
    """Validate a header's JSON (the N bytes after the length) against the file size.

    Checks: JSON object, no duplicate keys, dtype allow-list, integer shapes, shape x dtype size =
    byte span, offsets contiguous and non-overlapping, covering the data area exactly.
    """
    n = len(header_json)
    data_bytes = file_size - 8 - n
    obj = _strict_json_object(header_json, "bad safetensors header", "header is ")

    problems: list[str] = []
    metadata = obj.pop("__metadata__", None)
    if metadata is not None and not (
        isinstance(metadata, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())
    ):
        problems.append("__metadata__ must map strings to strings")
        metadata = None

    tensors: dict[str, TensorInfo] = {}
    for name, entry in obj.items():
        if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
            problems.append(f"{name}: entry must have exactly dtype, shape, data_offsets")
            continue
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if dtype not in DTYPE_BYTES:
            problems.append(f"{name}: dtype {dtype!r} is not one of {', '.join(sorted(DTYPE_BYTES))}")
            continue
        if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
            problems.append(f"{name}: shape {shape!r} must be a list of non-negative integers")
            continue
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int and o >= 0 for o in offsets)):
            problems.append(f"{name}: data_offsets {offsets!r} must be two non-negative integers")
            continue
        start, end = offsets
        if end < start:
            problems.append(f"{name}: data_offsets end {end} is before start {start}")
            continue
        want = math.prod(shape) * DTYPE_BYTES[dtype]
        if end - start != want:
            problems.append(f"{name}: shape {shape} x {dtype} is {want} bytes but its offsets span {end - start}")
            continue
        tensors[name] = TensorInfo(name, dtype, tuple(shape), start, end)

    # Contiguity: sorted by (start, end), each tensor starts where the previous ended.
    pos = 0
    for t in sorted(tensors.values(), key=lambda t: (t.start, t.end)):
        if t.start < pos:
            problems.append(f"{t.name}: bytes [{t.start}, {t.end}) overlap the previous tensor (ends at {pos})")
        elif t.start > pos:
            problems.append(f"{t.name}: gap of {t.start - pos} bytes before it (offsets not contiguous)")
        pos = max(pos, t.end)
    if pos != data_bytes and not problems:
        problems.append(f"tensors cover {pos} bytes but the data area holds {data_bytes}")
    if problems:
        raise SafetensorsError("bad safetensors header", problems)
    return SafetensorsHeader(header_bytes=n, data_bytes=data_bytes, tensors=tensors, metadata=metadata)


def load_index_json(raw: bytes) -> dict[str, Any]:
    """Parse an index file, refusing duplicate keys (a tensor named twice in `weight_map`)."""
    return _strict_json_object(raw, "bad safetensors index", "")


def _strict_json_object(raw: bytes, what: str, subject: str) -> dict[str, Any]:
    """A UTF-8 JSON object with no duplicate keys, or SafetensorsError(`what`, [the problem])."""
    try:
        obj = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except _DuplicateKey as e:
        raise SafetensorsError(what, [f"duplicate key {e.args[0]!r}"]) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SafetensorsError(what, [f"{subject}not valid JSON ({e})"]) from None
    if not isinstance(obj, dict):
        raise SafetensorsError(what, [f"{subject}not a JSON object"])
    return obj


def read_header(path: Path) -> SafetensorsHeader:
    """Read and validate the header of the safetensors file at `path` (reads only the header)."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        n = header_length(f.read(8), size)
        raw = f.read(n)
    return parse_header(raw, size)


def check_index(
    index: Mapping[str, Any], shards: Mapping[str, SafetensorsHeader], files: set[str] | None = None
) -> list[str]:
    """Problems between `model.safetensors.index.json` and the shards' headers (empty when consistent).

    `shards` maps every safetensors file name (beside the index) to its header; `files` are all file
    names present (defaults to the keys of `shards`).
    """
    files = set(shards) if files is None else files
    weight_map = index.get("weight_map") if isinstance(index, Mapping) else None
    if not isinstance(weight_map, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
    ):
        return ["index has no weight_map of tensor name -> file name"]
    problems: list[str] = []
    by_file: dict[str, set[str]] = {}
    for tensor, fname in weight_map.items():
        by_file.setdefault(fname, set()).add(tensor)
    for fname in sorted(by_file):
        if fname not in files:
            problems.append(f"index names file {fname} which does not exist")
        elif fname not in shards:
            problems.append(f"index names file {fname} which is not a safetensors shard")
    for fname in sorted(shards):
        have = set(shards[fname].tensors)
        want = by_file.get(fname, set())
        for t in sorted(want - have):
            problems.append(f"index says {t} is in {fname} but {fname} does not hold it")
        for t in sorted(have - want):
            owner = weight_map.get(t)
            where = f"the index puts it in {owner}" if owner else "the index does not name it"
            problems.append(f"{fname} holds {t} but {where}")
    return problems
