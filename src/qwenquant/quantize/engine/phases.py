"""Wall seconds per phase of the streamed engine's work (a decoder layer's steps, the parts after the loop,
the stage folder's), for `--verbose`, QuantizeResult.timings and the benchmarks."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import torch


class Phases:
    """Wall seconds per phase of one decoder layer, for `--verbose` and the benchmarks. A phase
    that ran GPU work ends with a CUDA synchronize, so its kernels are counted in it and not in
    whichever later phase first waits for them. Phases: read (waiting for the layer's tensors,
    which a thread reads while the previous layer runs and, on a GPU, copies there from pinned
    memory on a side stream), build, calibrate (forward with Hessian hooks), reduce (Hessians to
    their owner ranks), gptq (solve and pack), gather (packed modules to rank 0), write, barrier,
    rebuild (from the layer's artifact tensors), forward (the next layer's inputs). In one process
    `write` is only the time spent waiting for the writer thread (the previous layer's write before
    this one is handed over; the last layer's after its forward), the write itself overlapping
    rebuild, forward and the next layer; with ranks it is the whole write, on rank 0. Still serial
    with the GPU work: build and rebuild (the unpack; from memory for a layer quantized in this run)."""

    def __init__(self, device: str) -> None:
        self.sync = device == "cuda"
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            if self.sync:
                torch.cuda.synchronize()
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    def line(self) -> str:
        return ", ".join(f"{k} {v:.2f}" for k, v in self.seconds.items())
