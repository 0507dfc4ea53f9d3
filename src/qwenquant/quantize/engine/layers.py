"""Per-layer completion records: what makes the streamed GPTQ resumable after a crash.

Each finished decoder layer leaves `layer-NNNNN/tensors.safetensors` (every tensor of that layer as
it goes into the artifact: packed quantized Linears, unquantized tensors as the source's raw bytes)
and, written last, `layer-NNNNN/record.json`: layer index, the run's input fingerprint (source,
calibration, quantization parameters, device, engine), the file's sha256 and size, and a sha256
over the record itself. A record is trusted only when all of these check out against the current
inputs and the bytes on disk; existence alone proves nothing. The folder lives in the work area
beside the stage staging folders, so a killed stage's clean-up leaves it alone.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from qwenquant.atomic import atomic_write_bytes, pretty_json
from qwenquant.checkpoint.tensorfile import RawTensor, TensorRef, shard_refs, write_shard
from qwenquant.hashing import DigestCache, is_sealed, seal

RECORD = "record.json"
TENSORS = "tensors.safetensors"
SCHEMA = 1
ENGINE_VERSION = "streamed-1"  # part of every layer record's fingerprint and of the gptq stage's result


def resume_point(done: int, n: int) -> str:
    """Where the streamed engine goes on, said one way in `quantize --plan`, the log and the Ctrl-C line:
    decoder layers are counted from 1, the resume point is the first layer quantized anew, and layers
    1 to `done` are the ones replayed from their records ("decoder layer i of n replayed")."""
    if done <= 0:
        return f"starts at decoder layer 1 of {n}"
    if done >= n:
        return f"all {n} decoder layers are recorded (replayed, none quantized anew)"
    kept = "layer 1 is" if done == 1 else f"layers 1-{done} are"
    return f"resumes at decoder layer {done + 1} of {n}; {kept} recorded and replayed"


def layer_dir(root: Path, i: int) -> Path:
    return Path(root) / f"layer-{i:05d}"


def write_layer(
    root: Path,
    i: int,
    tensors: Mapping[str, RawTensor | TensorRef],
    fingerprint: str,
    digests: DigestCache | None = None,
) -> Path:
    """Persist layer i's artifact tensors, then its self-hashed record; return the tensors file.
    `digests`: the run's cache, which then holds the file's digest (the stage record reuses it)."""
    d = layer_dir(root, i)
    (d / RECORD).unlink(missing_ok=True)  # an older record never describes the file written next
    d.mkdir(parents=True, exist_ok=True)
    write_shard(d / TENSORS, list(tensors.values()))
    body: dict[str, Any] = {
        "schema_version": SCHEMA,
        "layer": i,
        "fingerprint": fingerprint,
        "file": TENSORS,
        "sha256": DigestCache.of(digests).file(d / TENSORS),
        "size": (d / TENSORS).stat().st_size,
        "tensors": sorted(tensors),
    }
    atomic_write_bytes(d / RECORD, pretty_json(seal(body, "record_sha256")))
    return d / TENSORS


def check_layer(
    root: Path, i: int, fingerprint: str, *, hash_tensors: bool = True, digests: DigestCache | None = None
) -> str | None:
    """None when layer i's record is trustworthy for these inputs, else why not. `hash_tensors`
    False compares the file's size only (what `quantize --plan` can afford). `digests`: the run's
    cache (the file's digest goes in it)."""
    d = layer_dir(root, i)
    try:
        body = json.loads((d / RECORD).read_bytes())
    except FileNotFoundError:
        return "no record"
    except (ValueError, UnicodeDecodeError):
        return "record is not valid JSON"
    if not is_sealed(body, "record_sha256"):
        return "record fails its self-hash"
    if body.get("schema_version") != SCHEMA or body.get("layer") != i:
        return "record is for another layer or format"
    if body.get("fingerprint") != fingerprint:
        return "inputs changed"
    f = d / TENSORS
    if (
        not f.is_file()
        or f.stat().st_size != body.get("size")
        or (hash_tensors and DigestCache.of(digests).file(f) != body.get("sha256"))
    ):
        return "tensors changed on disk"
    return None


def recorded_layers(root: Path, num_layers: int, fingerprint: str) -> int:
    """How many layers from 0 on have a record for these inputs and a tensors file of the recorded
    size: a read-only, hash-free look at where the streamed engine would resume."""
    k = 0
    while k < num_layers and check_layer(root, k, fingerprint, hash_tensors=False) is None:
        k += 1
    return k


def completed_layers(
    root: Path, num_layers: int, fingerprint: str, digests: DigestCache | None = None
) -> tuple[int, str]:
    """How many layers from 0 on are proven complete, and why the next one is not. Records after
    the first untrusted one are removed: their inputs came through a layer that will be redone."""
    k = 0
    reason = "no record"
    while k < num_layers:
        why = check_layer(root, k, fingerprint, digests=digests)
        if why is not None:
            reason = why
            break
        k += 1
    for j in range(k, num_layers):
        if layer_dir(root, j).exists():
            shutil.rmtree(layer_dir(root, j))
    return k, reason


def layer_refs(root: Path, i: int) -> dict[str, TensorRef]:
    """The tensors of a completed layer, by full name."""
    return shard_refs(layer_dir(root, i) / TENSORS)
