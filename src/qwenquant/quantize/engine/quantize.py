"""GPTQ for one decoder layer with llm-compressor 0.14's own functions, packed by compressed-tensors.

What `GPTQModifier` does per sequential subgraph, step for step (every upstream call through
modeling/compat.py): the recipe's scheme resolved by `GPTQModifier.resolve_quantization_config`
(W4A16 preset, actorder; `compat.resolve_scheme`), each target Linear initialized by
compressed-tensors with quantized forward disabled (`compat.prepare_module`), a forward hook
accumulating its Hessian (`compat.accumulate_hessian`, first-call order; computed once for Linears
that read the same input, see `LayerGPTQ`; `hessian_precision` "fp32" is llm-compressor's own
arithmetic, "tensor-core" multiplies bf16/fp16 inputs on tensor cores with float32 output), then the weight observers and the batched GPTQ solve
(`compat.gptq_modules`), and finally compressed-tensors' packing compressor (`compat.pack_module`,
`pack-quantized`: weight_packed int32, weight_scale, weight_shape; no zero point when symmetric).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import torch

from qwenquant.checkpoint.names import target_matches
from qwenquant.modeling import compat

log = logging.getLogger(__name__)


def target_modules(
    layer: torch.nn.Module, prefix: str, targets: Iterable[str], ignore: Iterable[str]
) -> dict[str, torch.nn.Linear]:
    """Full name -> Linear the recipe quantizes (compressed-tensors matching: class name, exact
    name or `re:` pattern; `ignore` wins)."""
    targets, ignore = list(targets), list(ignore)
    out = {}
    for rel, mod in layer.named_modules():
        name = prefix + rel
        if not isinstance(mod, torch.nn.Linear):
            continue
        hit = any(t == type(mod).__name__ or target_matches(t, name) for t in targets)
        if hit and not any(p == type(mod).__name__ or target_matches(p, name) for p in ignore):
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

    def __init__(
        self,
        modules: dict[str, torch.nn.Linear],
        scheme: Any,
        *,
        block_size: int,
        dampening_frac: float,
        batched: Any = "auto",
        hessian_precision: str = "tensor-core",
    ) -> None:
        self.modules = modules
        self.precision = hessian_precision
        self.names: dict[torch.nn.Module, str] = {m: n for n, m in modules.items()}
        self.block_size, self.dampening_frac, self.batched = block_size, dampening_frac, batched
        self.hessians: dict[torch.nn.Module, torch.Tensor] = {}
        self.counts: dict[torch.nn.Module, torch.Tensor] = {}
        self.shared: dict[torch.nn.Module, torch.nn.Module] = {}  # module -> the module whose Hessian it shares
        # this sample's inputs: id -> (the tensor, kept alive so the id stays its own; its version; first module)
        self._inputs: dict[int, tuple[torch.Tensor, int, torch.nn.Module]] = {}
        self._called: set[torch.nn.Module] = set()
        self._new: set[torch.nn.Module] = set()  # Hessians created in this sample
        for mod in modules.values():
            compat.prepare_module(mod, scheme)
        self._hooks = [m.register_forward_hook(self._hook) for m in modules.values()]

    def _hook(self, module: torch.nn.Linear, args: tuple[torch.Tensor, ...], _out: torch.Tensor) -> None:
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
                raise RuntimeError(
                    f"{self.names[module]} shares its Hessian with {self.names[self.shared[module]]}, "
                    "but a later calibration sample gave them different inputs"
                )
            return  # its Hessian was updated with this input already
        if module not in self.counts and same is not None and same in self._new:
            self.shared[module] = same  # both start in this sample with the same input: one Hessian
            self.hessians[module], self.counts[module] = self.hessians[same], self.counts[same]
            return
        if seen is None:
            self._inputs[id(x)] = (x, x._version, module)
        if module not in self.counts:
            self.hessians[module] = compat.empty_hessian(module)
            self.counts[module] = torch.zeros((), device=module.weight.device)
            self._new.add(module)
        self.hessians[module], self.counts[module] = compat.accumulate_hessian(
            x, module, self.hessians[module], self.counts[module], self.precision
        )

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
        self.remove_hooks()
        wanted = set(self.modules) if only is None else only
        # llm-compressor quantizes in first-hook-call order; a module no sample reached has count 0
        done = [m for m in self.counts if self.names[m] in wanted and float(self.counts[m]) > 0]
        if not done and not wanted:
            return {}  # a rank of an N-process job that owns none of this layer's modules
        for mod in compat.gptq_modules(
            done,
            self.hessians,
            self.counts,
            block_size=self.block_size,
            dampening_frac=self.dampening_frac,
            batched=self.batched,
        ):
            log.warning("%s: Hessian not positive definite, round-to-nearest used", self.names[mod])
        packed = {
            self.names[mod]: {k: v.detach().to("cpu").contiguous() for k, v in compat.pack_module(mod).items()}
            for mod in done
        }
        missing = sorted(wanted - {self.names[m] for m in done})
        if missing:
            raise RuntimeError(f"no calibration input reached {', '.join(missing[:5])}")
        return packed
