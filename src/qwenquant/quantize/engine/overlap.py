"""What overlaps the layer loop of engine/run.py: the writer thread (one layer's file and record in flight at
most) and the next layer's read, with its host-to-GPU copy on a side stream."""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from qwenquant.checkpoint.tensorfile import RawTensor, TensorRef
from qwenquant.hashing import DigestCache
from qwenquant.modeling.text import TextModelSource, read_layer
from qwenquant.quantize.engine import layers as L


class _Writer:
    """write_layer on one background thread, one layer in flight at most."""

    def __init__(self, root: Path, fingerprint: str, digests: DigestCache | None = None) -> None:
        self.root, self.fingerprint, self.digests = root, fingerprint, digests
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="qwenquant-write")
        self.pending: Future | None = None

    def wait(self) -> None:
        """Block until the layer in flight has its file and record; a failed write raises its error."""
        fut, self.pending = self.pending, None
        if fut is not None:
            fut.result()

    def submit(self, i: int, tensors: Mapping[str, RawTensor | TensorRef]) -> None:
        """Hand layer i to the thread once the previous layer is written (records stay in layer order)."""
        self.wait()
        self.pending = self.pool.submit(L.write_layer, self.root, i, tensors, self.fingerprint, self.digests)

    def close(self) -> None:
        # a write in flight when the loop fails runs to its end: complete with its record, or recordless
        self.pool.shutdown(wait=True)


class _Copier:
    """The next layer's host-to-GPU copy on a side stream from pinned memory, issued by the prefetch
    thread while the GPU works on the current layer (the same bytes as `build_layer`'s own copy)."""

    def __init__(self, dev: torch.device) -> None:
        self.dev = dev  # explicit: a thread's current CUDA device is its own, not the caller's
        self.stream = torch.cuda.Stream(device=dev)

    @staticmethod
    def on(device: str) -> _Copier | None:
        return _Copier(torch.device("cuda", torch.cuda.current_device())) if device == "cuda" else None

    def copy(self, raw: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], Any]:
        with torch.cuda.device(self.dev), torch.cuda.stream(self.stream):
            out = {k: t.pin_memory().to(self.dev, non_blocking=True) for k, t in raw.items()}
            done = torch.cuda.Event()
            done.record(self.stream)
        return out, done


def _prefetch(src: TextModelSource, i: int, copier: _Copier | None) -> Any:
    raw = read_layer(src, i)
    return raw if copier is None else copier.copy(raw)


def _arrived(fut: Future) -> dict[str, torch.Tensor]:
    """A prefetched layer's tensors, usable on the current stream (its copies waited for, and
    their memory kept from reuse until the current stream is done with it)."""
    got = fut.result()
    if isinstance(got, dict):
        return got
    raw, done = got
    stream = torch.cuda.current_stream()
    stream.wait_event(done)
    for t in raw.values():
        t.record_stream(stream)
    return raw
