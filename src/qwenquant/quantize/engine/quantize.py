"""GPTQ for one decoder layer with llm-compressor 0.14's own functions, packed by compressed-tensors.

What `GPTQModifier` does per sequential subgraph, step for step: the recipe's scheme resolved by
`GPTQModifier.resolve_quantization_config` (W4A16 preset, actorder), each target Linear initialized
by compressed-tensors (`initialize_module_for_quantization`) with quantized forward disabled, a
forward hook accumulating its Hessian (`accumulate_hessian`, first-call order; computed once for
Linears that read the same input, see `LayerGPTQ`), then the weight
observer (`initialize_observer` + `observe`), `assign_batches` / `prepare_batch` /
`quantize_weight` / `update_batch_qparams`, and finally compressed-tensors' packing compressor
(`pack-quantized`: weight_packed int32, weight_scale, weight_shape; no zero point when symmetric).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import torch

from qwenquant.checkpoint.identity import matches

log = logging.getLogger(__name__)

PACKED_FORMAT = "pack-quantized"


def resolve_scheme(q: Any) -> Any:
    """The QuantizationScheme GPTQModifier builds from the recipe's `quantization` section."""
    from qwenquant.quantize.stages.gptq import build_modifier

    config = build_modifier(q).resolve_quantization_config()
    groups = list(config.config_groups.values())
    if len(groups) != 1:
        raise ValueError(f"expected one config group from the recipe, got {len(groups)}")
    return groups[0]


def quantization_config(scheme: Any) -> dict[str, Any]:
    """config.json's `quantization_config` as `save_pretrained(save_compressed=True)` writes it
    (compressed-tensors `ModelCompressor.update_config`); `ignore` is filled in by the caller."""
    import compressed_tensors
    from compressed_tensors.quantization import QuantizationConfig, QuantizationStatus

    s = scheme.model_copy(deep=True)
    s.format = PACKED_FORMAT
    cfg = QuantizationConfig(config_groups={"group_0": s}, format=PACKED_FORMAT,
                             quantization_status=QuantizationStatus.COMPRESSED, ignore=[])
    return {"version": compressed_tensors.__version__, "quant_method": "compressed-tensors", "sparsity_config": {},
            "transform_config": {}, **cfg.model_dump(exclude=["quant_method"])}


def target_modules(layer: torch.nn.Module, prefix: str, targets: Iterable[str], ignore: Iterable[str]
                   ) -> dict[str, torch.nn.Linear]:
    """Full name -> Linear the recipe quantizes (compressed-tensors matching: class name, exact
    name or `re:` pattern; `ignore` wins)."""
    targets, ignore = list(targets), list(ignore)
    out = {}
    for rel, mod in layer.named_modules():
        name = prefix + rel
        if not isinstance(mod, torch.nn.Linear):
            continue
        hit = any(t == type(mod).__name__ or matches(t, name) for t in targets)
        if hit and not any(p == type(mod).__name__ or matches(p, name) for p in ignore):
            out[name] = mod
    return out


class LayerGPTQ:
    """Hessian hooks on one layer's target Linears, then GPTQ and packing.

    Linears fed the very same input tensor (q/k/v, gate/up, the linear attention's in_proj_qkv and
    in_proj_z) would each add the same x^T x to their Hessian: llm-compressor's hooks compute it
    once per module, the largest cost of a calibration forward at real width. Here such modules
    share one Hessian (and count) tensor, updated once per sample, when they were first called
    with the same input object in the same sample; every later sample must give them the same
    input again (else RuntimeError). The result is the same bits (the same matmul on the same
    input); `unshare()` gives each module its own copy where something updates them in place."""

    def __init__(self, modules: dict[str, torch.nn.Linear], scheme: Any, *, block_size: int,
                 dampening_frac: float, batched: Any = "auto") -> None:
        from compressed_tensors.quantization import disable_quantization
        from compressed_tensors.quantization.lifecycle.initialize import initialize_module_for_quantization

        self.modules = modules
        self.names = {m: n for n, m in modules.items()}
        self.block_size, self.dampening_frac, self.batched = block_size, dampening_frac, batched
        self.hessians: dict[torch.nn.Module, torch.Tensor] = {}
        self.counts: dict[torch.nn.Module, torch.Tensor] = {}
        self.shared: dict[torch.nn.Module, torch.nn.Module] = {}  # module -> the module whose Hessian it shares
        # this sample's inputs: id -> (the tensor, kept alive so the id stays its own; its version; first module)
        self._inputs: dict[int, tuple[torch.Tensor, int, torch.nn.Module]] = {}
        self._called: set[torch.nn.Module] = set()
        self._new: set[torch.nn.Module] = set()  # Hessians created in this sample
        for mod in modules.values():
            initialize_module_for_quantization(mod, scheme.model_copy(deep=True), force_zero_point=True)
            disable_quantization(mod)  # calibration forwards run the unquantized weight (DisableQuantization)
        self._hooks = [m.register_forward_hook(self._hook) for m in modules.values()]

    def _hook(self, module: torch.nn.Module, args: tuple[torch.Tensor, ...], _out: torch.Tensor) -> None:
        from llmcompressor.modifiers.gptq.helpers import accumulate_hessian, make_empty_hessian

        if module in self._called:  # a module called again: the next sample's forward began
            self._inputs.clear()
            self._called.clear()
            self._new.clear()
        self._called.add(module)
        x = args[0]
        seen = self._inputs.get(id(x))
        same = seen[2] if seen is not None and seen[1] == x._version else None
        if module in self.shared:
            if same is not self.shared[module]:
                raise RuntimeError(f"{self.names[module]} shares its Hessian with {self.names[self.shared[module]]}, "
                                   "but a later calibration sample gave them different inputs")
            return  # its Hessian was updated with this input already
        if module not in self.counts and same is not None and same in self._new:
            self.shared[module] = same  # both start in this sample with the same input: one Hessian
            self.hessians[module], self.counts[module] = self.hessians[same], self.counts[same]
            return
        if seen is None:
            self._inputs[id(x)] = (x, x._version, module)
        if module not in self.counts:
            dev = module.weight.device
            self.hessians[module] = make_empty_hessian(module, device=dev)
            self.counts[module] = torch.zeros((), device=dev)
            self._new.add(module)
        self.hessians[module], self.counts[module] = accumulate_hessian(
            x, module, self.hessians[module], self.counts[module])

    def remove_hooks(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self._inputs.clear()

    def unshare(self) -> None:
        """Give every module its own Hessian and count tensors (before an in-place update such as
        a reduction across ranks)."""
        for mod in self.shared:
            self.hessians[mod], self.counts[mod] = self.hessians[mod].clone(), self.counts[mod].clone()
        self.shared = {}

    @torch.no_grad()
    def quantize(self, only: set[str] | None = None) -> dict[str, dict[str, torch.Tensor]]:
        """GPTQ every calibrated module (weights replaced by their fake-quantized values), then
        pack; return full module name -> {weight_packed, weight_scale, weight_shape} on the CPU.
        `only`: the modules this rank owns in an N-process job (default: all)."""
        from compressed_tensors.compressors.base import BaseCompressor
        from compressed_tensors.utils import getattr_chain
        from llmcompressor.modifiers.gptq.gptq_quantize import quantize_weight
        from llmcompressor.modifiers.gptq.helpers import assign_batches, prepare_batch, update_batch_qparams
        from llmcompressor.modifiers.quantization.calibration import initialize_observer, observe

        self.remove_hooks()
        wanted = set(self.modules) if only is None else only
        # llm-compressor quantizes in first-hook-call order; a module no sample reached has count 0
        done = [m for m in self.counts if self.names[m] in wanted and float(self.counts[m]) > 0]
        if not done and not wanted:
            return {}  # a rank of an N-process job that owns none of this layer's modules
        for mod in done:
            initialize_observer(mod, "weight")
        observe(done, base_name="weight")
        for batch in assign_batches(done, self.batched, self.block_size):
            qargs = getattr_chain(batch[0], "quantization_scheme.weights")
            qparams = [m.weight_observer.get_qparams() for m in batch]
            weights, hessians, scales, zps, gscales = prepare_batch(batch, qparams, self.hessians, self.counts)
            quantized, _losses, fallback = quantize_weight(
                weights=weights, hessians=hessians, scale=scales, zero_point=zps, global_scale=gscales,
                quant_args=qargs, blocksize=self.block_size, percdamp=self.dampening_frac)
            for i in torch.nonzero(fallback).flatten().tolist():
                log.warning("%s: Hessian not positive definite, round-to-nearest used", self.names[batch[i]])
            update_batch_qparams(batch, quantized, scales, zps, gscales, qargs)
            del weights, hessians, quantized
        packed = {}
        compressor = BaseCompressor.get_value_from_registry(PACKED_FORMAT)
        for mod in done:
            scheme = mod.quantization_scheme
            state = {"weight": mod.weight.data, "weight_scale": mod.weight_scale.data,
                     "weight_zero_point": mod.weight_zero_point.data}
            out = compressor.compress(state, scheme)
            packed[self.names[mod]] = {k: v.detach().to("cpu").contiguous() for k, v in out.items()}
        missing = sorted(wanted - {self.names[m] for m in done})
        if missing:
            raise RuntimeError(f"no calibration input reached {', '.join(missing[:5])}")
        return packed


def unpack(packed: dict[str, torch.Tensor], scheme: Any) -> torch.Tensor:
    """The dequantized weight compressed-tensors loads from `packed` (what serving computes with)."""
    from compressed_tensors.compressors.base import BaseCompressor

    compressor = BaseCompressor.get_value_from_registry(PACKED_FORMAT)
    return compressor.decompress(dict(packed), scheme)["weight"]
