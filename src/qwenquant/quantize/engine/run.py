"""The layer-streamed GPTQ pass: one decoder layer in memory at a time, resumable per layer.

Why the layer loop is owned here rather than llm-compressor's: its sequential pipeline needs the
whole model built (host RAM about 2x the checkpoint: 110 GiB for the 27B), and its offloaded
loading (`load_offloaded_model` + `device_map="auto_offload"`) failed on an H200 with
llmcompressor 0.14.0.1 / compressed-tensors 0.19.0 at the first onload during subgraph tracing:
"CUDA error: an illegal memory access" in compressed-tensors' `offload/cache/cpu.py`
(`send_tensors(..., copy=False)`), with and without a memory cap. It also has no resume.
The GPTQ math stays llm-compressor's (engine/quantize.py); this module only schedules it:

  embeddings of the calibration tokens -> for each layer: read its tensors from the source shards
  (the next layer's read overlaps this layer's GPTQ), calibration forward of every sample (batch
  1, Hessian hooks), GPTQ, pack, persist + record (on a writer thread, overlapping what follows),
  rebuild the layer from its artifact tensors and forward again to give the next layer its inputs
  (llm-compressor's `propagate_error=True`: the next layer sees the quantized outputs) -> final
  norm -> lm_head Hessian + held-out hidden states.

The next layer's inputs always come from the layer's artifact tensors, the very bytes its file
holds: a fresh layer is rebuilt from the tensors handed to the writer (packed parts in memory,
unquantized tensors read from the source), a resumed one from its file. So a resumed run replays
exactly the arithmetic of an uninterrupted one and ends on the same bytes. One layer's write is in
flight at most; the loop waits for it before handing over the next layer and before it returns, and
a write that failed raises its own error there (its layer has no record: write_layer writes the
record last). With `ranks` (engine/dist.py, `quantize --gpus N`) each process forwards its share of
the samples, Hessians meet on an owner rank per module, and rank 0 alone writes layer records, in
the loop (no writer thread): a barrier follows and every rank rebuilds the layer from its file.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from qwenquant.checkpoint.assemble import torch_raw
from qwenquant.checkpoint.identity import quantized_module
from qwenquant.checkpoint.tensorfile import RawTensor, TensorRef
from qwenquant.hashing import DigestCache
from qwenquant.modeling.compat import resolve_scheme, unpack
from qwenquant.modeling.text import (
    LayerInputs,
    TextModelSource,
    build_layer,
    embed_samples,
    read_layer,
    ref_tensor,
)
from qwenquant.quantize.engine import headcal
from qwenquant.quantize.engine import layers as L
from qwenquant.quantize.engine.layers import ENGINE_VERSION  # noqa: F401  (re-exported)
from qwenquant.quantize.engine.overlap import _arrived, _Copier, _prefetch, _Writer
from qwenquant.quantize.engine.phases import Phases
from qwenquant.quantize.engine.quantize import LayerGPTQ, target_modules

log = logging.getLogger(__name__)


@dataclass
class StreamResult:
    layer_files: list[Path]  # layer i's artifact tensors
    quantized_modules: int
    resumed_from: int  # layers taken from verified records
    head: Any  # engine.headcal.HeadCalibration
    seconds_per_layer: list[float]
    samples: list[int]  # the calibration samples this process forwarded (all of them in one process)
    phases: list[dict[str, float]]  # per layer: seconds in each phase (see engine/phases.py `Phases`)
    mtp: dict[str, Any] | None = None  # packed MTP Linears (`mtp: {quantize: gptq}`), engine/mtpcal.py
    tail: dict[str, float] = field(default_factory=dict)  # seconds after the loop, by part (timings.Timings.gptq_tail)


def apply_gpu_cap(device: str, max_gpu_mem_gib: float | None) -> None:
    """Cap this process's CUDA allocations (a big GPU then behaves like a small one)."""
    if device != "cuda" or not max_gpu_mem_gib:
        return
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    frac = min(1.0, max_gpu_mem_gib * (1 << 30) / total)
    torch.cuda.set_per_process_memory_fraction(frac)
    log.info("gptq: GPU memory capped at %.1f GiB (%.3f of %.1f GiB)", max_gpu_mem_gib, frac, total / (1 << 30))


def calibration_order(samples: list[list[int]]) -> list[int]:
    """The order llm-compressor's LengthAwareSampler feeds samples in (longest first, its own
    argsort call): Hessians are sums, and float sums depend on their order."""
    return torch.argsort(torch.tensor([len(s) for s in samples]), descending=True).tolist()


def _forward_all(
    layer: torch.nn.Module, acts: list[torch.Tensor], inputs: LayerInputs, layer_type: str, *, keep: bool
) -> None:
    """Every sample through `layer` (batch 1); replace each input by its output when `keep`."""
    with torch.no_grad():
        for j, x in enumerate(acts):
            y = layer(x, **inputs.kwargs(x, layer_type))
            if keep:
                acts[j] = y
            del y


def _quantized_layer(
    src: TextModelSource, i: int, refs: Mapping[str, RawTensor | TensorRef], scheme: Any, device: str
) -> torch.nn.Module:
    """Layer i rebuilt from its artifact tensors (those of its file, or those handed to write_layer:
    the same names, dtypes and bytes): packed Linears dequantized as a loader would, on `device`
    (the packed bytes cross to the GPU, a quarter of the dense weights; the unpack is integer shifts
    and one bf16 multiply per weight, the same bits on either device)."""
    prefix = src.layer_prefix(i)
    tensors: dict[str, torch.Tensor] = {}
    packed: dict[str, dict[str, torch.Tensor]] = {}
    for name, ref in refs.items():
        mod = quantized_module(name)
        if mod is None:
            tensors[name[len(prefix) :]] = ref_tensor(ref)
        else:
            packed.setdefault(mod, {})[name.rsplit(".", 1)[1]] = ref_tensor(ref)
    for mod, parts in packed.items():
        tensors[mod[len(prefix) :] + ".weight"] = unpack(
            {k: v if k == "weight_shape" else v.to(device) for k, v in parts.items()}, scheme
        )
    return build_layer(src, i, tensors, device)


def _gptq_layer(
    src: TextModelSource,
    i: int,
    raw: dict[str, torch.Tensor],
    acts: list[torch.Tensor],
    inputs: LayerInputs,
    q: Any,
    scheme: Any,
    device: str,
    ranks: Any,
    phase: Phases,
) -> dict[str, Any] | None:
    """Calibrate and quantize layer i; return its artifact tensors (packed + unquantized source refs).
    In an N-process job (`ranks`: engine.dist.Ranks) the Hessians meet on each module's owner rank
    and the packed modules on rank 0, which alone returns the tensors (None elsewhere). `phase`
    times the steps (the caller's per-layer Phases)."""
    prefix = src.layer_prefix(i)
    with phase("build"):
        layer = build_layer(src, i, raw, device)
        mods = target_modules(layer, prefix, q.targets, q.ignore)
        gptq = LayerGPTQ(
            mods,
            scheme,
            block_size=q.block_size,
            dampening_frac=q.dampening_frac,
            hessian_precision=q.hessian_precision,
        )
    with phase("calibrate"):
        _forward_all(layer, acts, inputs, src.config.layer_types[i], keep=False)
    if ranks is None:
        with phase("gptq"):
            packed: dict[str, Any] | None = gptq.quantize()
    else:
        from qwenquant.quantize.engine import dist
        from qwenquant.quantize.engine.ranks import owners

        gptq.remove_hooks()
        owner = owners({n: (m.weight.shape[0], m.weight.shape[1]) for n, m in mods.items()}, ranks.world)
        with phase("reduce"):
            dist.reduce_hessians(gptq, owner, ranks)
        with phase("gptq"):
            mine = gptq.quantize(only={n for n, r in owner.items() if r == ranks.rank})
        with phase("gather"):
            packed = dist.gather_packed(mine, ranks)
    del layer, gptq
    if packed is None:
        return None
    out: dict[str, Any] = {}
    for name in src.layer_names(i):
        mod = name[: -len(".weight")] if name.endswith(".weight") else None
        if mod not in packed:
            out[name] = src.refs[name]  # unquantized: the source's exact bytes
    for mod, parts in packed.items():
        for leaf, t in parts.items():
            out[f"{mod}.{leaf}"] = torch_raw(f"{mod}.{leaf}", t)
    return {"tensors": out, "modules": len(packed)}


def _resume_point(
    layers_root: Path, n: int, fingerprint: str, device: str, ranks: Any, digests: DigestCache | None = None
) -> int:
    """Layers proven complete by their records (rank 0 checks, and removes stale ones; the other
    ranks are told)."""
    done = 0
    if ranks is None or ranks.main:
        done, why = L.completed_layers(layers_root, n, fingerprint, digests)
        if done:
            log.info("gptq: %s%s", L.resume_point(done, n), f"; decoder layer {done + 1}: {why}" if done < n else "")
    if ranks is not None:
        from qwenquant.quantize.engine import dist

        done = dist.broadcast_int(done, device)
    return done


def my_samples(samples: list[list[int]], ranks: Any) -> list[int]:
    """Sample indices this process forwards, in the calibration order: all of them in one process,
    else this rank's contiguous share (engine/ranks.split_shares)."""
    from qwenquant.quantize.engine.ranks import split_shares

    order = calibration_order(samples)
    if ranks is None:
        return order
    share = split_shares([len(samples[k]) for k in order], ranks.world)[ranks.rank]
    return [order[p] for p in share]


class _LayerLoop:
    """The steps of one decoder layer in the loop and what they share across layers: the calibration
    activations (`acts`, replaced by each layer's outputs), the prefetch thread (the next layer's read,
    its host-to-GPU copy on a side stream) and, in one process, the writer thread; with `ranks`, rank 0
    writes in the loop and a barrier follows. Layers below `done` are resumed from their records."""

    def __init__(
        self,
        src: TextModelSource,
        q: Any,
        scheme: Any,
        layers_root: Path,
        fingerprint: str,
        device: str,
        ranks: Any,
        digests: DigestCache | None,
        acts: list[torch.Tensor],
        done: int,
    ) -> None:
        self.src, self.q, self.scheme, self.device, self.ranks = src, q, scheme, device, ranks
        self.layers_root, self.fingerprint, self.digests = layers_root, fingerprint, digests
        self.acts, self.done = acts, done
        self.inputs = LayerInputs(src, device)
        self.pool = ThreadPoolExecutor(max_workers=1)
        self.copier = _Copier.on(device)
        self.nxt: Future | None = None
        self.background = _Writer(layers_root, fingerprint, digests) if ranks is None else None

    def step(self, i: int) -> tuple[Mapping[str, RawTensor | TensorRef], Phases]:
        """Layer i quantized (or resumed from its record), rebuilt from its artifact tensors and run
        forward over every sample to give the next layer its inputs; its tensors and its phases."""
        n, done = self.src.num_layers, self.done
        phase = Phases(self.device)
        refs: Mapping[str, RawTensor | TensorRef] | None = None
        if i >= done:
            refs = self._quantize(i, phase)
        elif self.pool and i + 1 == done and done < n:
            self.nxt = self.pool.submit(_prefetch, self.src, done, self.copier)
        with phase("rebuild"):
            refs = refs if refs is not None else L.layer_refs(self.layers_root, i)  # resumed, or with ranks
            layer = _quantized_layer(self.src, i, refs, self.scheme, self.device)
        with phase("forward"):
            _forward_all(layer, self.acts, self.inputs, self.src.config.layer_types[i], keep=True)
        del layer
        if self.background is not None and self.background.pending is not None and i + 1 == n:
            with phase("write"):
                self.background.wait()  # the last layer's file and record, before the head calibration
        return refs, phase

    def _quantize(self, i: int, phase: Phases) -> Mapping[str, RawTensor | TensorRef] | None:
        """Layer i read (prefetched: the next one's read starts here), calibrated, quantized and handed to
        the writer thread (with ranks: written by rank 0, then a barrier); the tensors handed over, None
        when they are to be read back from the layer's file."""
        src = self.src
        with phase("read"):
            raw = _arrived(self.nxt) if self.nxt is not None else read_layer(src, i)
        self.nxt = (
            self.pool.submit(_prefetch, src, i + 1, self.copier) if self.pool and i + 1 < src.num_layers else None
        )
        res = _gptq_layer(src, i, raw, self.acts, self.inputs, self.q, self.scheme, self.device, self.ranks, phase)
        del raw
        refs = None
        if res is not None and self.background is not None:
            with phase("write"):
                self.background.submit(i, res["tensors"])
            refs = res["tensors"]  # what the writer persists, so no read-back
        elif res is not None:
            with phase("write"):
                L.write_layer(self.layers_root, i, res["tensors"], self.fingerprint, self.digests)
        if self.ranks is not None:
            from qwenquant.quantize.engine import dist

            with phase("barrier"):
                dist.barrier()  # the record exists before any rank reads the layer back
        return refs

    def close(self) -> None:
        """Stop the prefetch thread (a read in flight is waited for) and the writer thread."""
        if self.pool:
            self.pool.shutdown(wait=True, cancel_futures=True)
        if self.background is not None:
            self.background.close()


def stream_quantize(
    src: TextModelSource,
    samples: list[list[int]],
    q: Any,
    layers_root: Path,
    *,
    fingerprint: str,
    device: str,
    heldout: list[int],
    progress: Callable[[int, int], None] | None = None,
    ranks: Any = None,
    mtp: bool = False,
    digests: DigestCache | None = None,
) -> StreamResult:
    """Run the layer loop (resuming from verified layer records); see the module docstring.
    `ranks` (engine.dist.Ranks): one process of an N-process job; the result's `head` is then
    complete on rank 0 only. `mtp`: also calibrate and quantize the MTP head (engine/mtpcal.py).
    `digests`: the run's cache, given every layer file's digest (the stage record reuses them)."""
    n = src.num_layers
    scheme = resolve_scheme(q)
    done = _resume_point(layers_root, n, fingerprint, device, ranks, digests)
    order = my_samples(samples, ranks)
    acts = embed_samples(src, [samples[k] for k in order], device)
    loop = _LayerLoop(src, q, scheme, layers_root, fingerprint, device, ranks, digests, acts, done)
    files, modules, times, phases = [], 0, [], []
    writer = ranks is None or ranks.main
    try:
        for i in range(n):
            t0 = time.perf_counter()
            refs, phase = loop.step(i)
            files.append(L.layer_dir(layers_root, i) / L.TENSORS)
            modules += sum(1 for nm in refs if nm.endswith(".weight_packed"))
            times.append(time.perf_counter() - t0)
            phases.append(phase.seconds)
            if writer:
                log.info(
                    "gptq: decoder layer %d of %d %s (%.1f s)",
                    i + 1,
                    n,
                    "replayed" if i < done else "quantized",
                    times[-1],
                )
            log.debug("gptq: decoder layer %d phases (s): %s", i + 1, phase.line())
            if progress:
                progress(i + 1, n)
    finally:
        loop.close()
    head, packed_mtp, tail = _after_layers(src, q, scheme, samples, acts, order, heldout, device, ranks, mtp)
    return StreamResult(files, modules, done, head, times, order, phases, packed_mtp, tail)


def _after_layers(
    src: TextModelSource,
    q: Any,
    scheme: Any,
    samples: list[list[int]],
    acts: list[torch.Tensor],
    order: list[int],
    heldout: list[int],
    device: str,
    ranks: Any,
    mtp: bool,
) -> tuple[Any, dict[str, Any] | None, dict[str, float]]:
    """After the layer loop, on the last layer's outputs: the lm_head calibration (`headcal.calibrate`)
    and, with `mtp`, the MTP head's calibration on the same hidden states and its GPTQ; the head's
    calibration, the packed MTP Linears and the seconds of each part (QuantizeResult.timings: a
    projection scales each part by what it reads)."""
    mtpcal = None
    tail = Phases(device)
    if mtp:
        from qwenquant.quantize.engine.mtpcal import MtpCalibration

        mtpcal = MtpCalibration(src, q, scheme, device)
    with tail("head_calibration"):
        head = headcal.calibrate(
            src,
            acts,
            order,
            heldout,
            device,
            ranks,
            q.hessian_precision,
            mtp=None if mtpcal is None else (mtpcal, samples),
        )
    packed_mtp = None
    if mtpcal is not None:
        with tail("mtp_gptq"):
            packed_mtp = mtpcal.quantize()
    log.debug("gptq: after the layer loop (s): %s", tail.line())
    return head, packed_mtp, dict(tail.seconds)
