"""llm-compressor and compressed-tensors, behind one module: the next upgrade is a change here.

qwenquant calls both packages' internals (the GPTQ steps the streamed engine schedules itself, the
packing compressor, the scheme models), which move between releases. Every import of either
package in src/qwenquant goes through `_upstream` below, so this file is the whole list; the
tests compare against the upstream functions directly, on purpose.

Pinned (constraints/quant.txt): llmcompressor 0.14.0.1, compressed-tensors 0.19.0. `check_version`
is the one version check: another installed version logs one warning naming the pin and what to
install; a function that is not where the table says raises StageError with the same advice.

What has moved on llm-compressor's main since 0.14 (read 2026-12): `modifiers/gptq/helpers.py` is
gone; `make_empty_hessian` and `accumulate_hessian` live in `modifiers/gptq/gptq_quantize.py`
with the same signatures; `quantize_weight(module, quant_args, hessian, blocksize, percdamp)`
quantizes one module (reading `module.weight_observer` itself) and returns `(loss, q_param_dict)`,
with no `prepare_batch` / `assign_batches` / `update_batch_qparams` batching. Porting means the
`_WHERE` rows and the body of `gptq_modules` (per module: quantize_weight on `H / count`, then
`update_offload_parameter` of each q_param_dict entry).

The Hessian's precision is decided only in `empty_hessian`, `accumulate_hessian` and `gram`:
`precision="fp32"` is llm-compressor's own arithmetic (`H += (sqrt2 x)^T (sqrt2 x)` in float32,
GPTQ_PRECISION); `"tensor-core"` (the default) keeps its meaning (the un-normalised sum of 2 x^T x,
the count grown by the batch size, llm-compressor dividing by it before the solve) but multiplies
bf16/fp16 Linear inputs as they are, with float32 output: `torch.mm(x.t(), x, out_dtype=float32)`
on CUDA (tensor cores), `x.float().t() @ x.float()` on the CPU. Every product of two bf16 values is
exact in float32, so only the summation order differs from the fp32 path (relative error against
float64 about 6e-6 instead of 2-3e-6); the factor 2 is applied exactly, by `add_(.., alpha=2)`.
"""

from __future__ import annotations

import functools
import importlib
import logging
from collections.abc import Iterable
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from qwenquant.errors import StageError

if TYPE_CHECKING:
    import torch

    from qwenquant.recipe import QuantizationSpec

log = logging.getLogger(__name__)

PINNED = {"llmcompressor": "0.14.0.1", "compressed-tensors": "0.19.0"}
PACKED_FORMAT = "pack-quantized"
_INSTALL = (
    "install the pinned versions: pip install "
    + " ".join(f"{d}=={v}" for d, v in PINNED.items())
    + " (constraints/quant.txt; scripts/install.sh does it)"
)

_LC, _CT = "llmcompressor", "compressed-tensors"
# name -> (distribution, module) of every upstream object qwenquant uses
_WHERE = {
    "GPTQModifier": (_LC, "llmcompressor.modifiers.gptq"),
    "oneshot": (_LC, "llmcompressor"),
    "make_empty_hessian": (_LC, "llmcompressor.modifiers.gptq.helpers"),
    "accumulate_hessian": (_LC, "llmcompressor.modifiers.gptq.helpers"),
    "assign_batches": (_LC, "llmcompressor.modifiers.gptq.helpers"),
    "prepare_batch": (_LC, "llmcompressor.modifiers.gptq.helpers"),
    "update_batch_qparams": (_LC, "llmcompressor.modifiers.gptq.helpers"),
    "quantize_weight": (_LC, "llmcompressor.modifiers.gptq.gptq_quantize"),
    "initialize_observer": (_LC, "llmcompressor.modifiers.quantization.calibration"),
    "observe": (_LC, "llmcompressor.modifiers.quantization.calibration"),
    "initialize_module_for_quantization": (_CT, "compressed_tensors.quantization.lifecycle.initialize"),
    "disable_quantization": (_CT, "compressed_tensors.quantization"),
    "QuantizationArgs": (_CT, "compressed_tensors.quantization"),
    "QuantizationScheme": (_CT, "compressed_tensors.quantization"),
    "QuantizationConfig": (_CT, "compressed_tensors.quantization"),
    "QuantizationStatus": (_CT, "compressed_tensors.quantization"),
    "getattr_chain": (_CT, "compressed_tensors.utils"),
    "BaseCompressor": (_CT, "compressed_tensors.compressors.base"),
    "pack_to_int32": (_CT, "compressed_tensors.compressors.pack_quantized.helpers"),
    "unpack_from_int32": (_CT, "compressed_tensors.compressors.pack_quantized.helpers"),
    "__version__": (_CT, "compressed_tensors"),
}


def version_warning(dist: str, installed: str, pinned: str) -> str | None:
    """Pure: what to tell the user when `installed` is not the pinned version (None when it is)."""
    if installed == pinned:
        return None
    return (
        f"{dist} {installed} is installed; qwenquant is pinned to {dist} {pinned}, whose internals it calls: "
        f"a moved function fails with a message, a changed one may give other bytes. To be safe, {_INSTALL}"
    )


@functools.cache
def check_version(dist: str) -> str:
    """The installed version of `dist` (one of PINNED); a version other than the pin is logged
    once, a missing package raises StageError."""
    try:
        installed = version(dist)
    except PackageNotFoundError:
        raise StageError(
            f"{dist} is not installed (qwenquant's quantization stack: "
            f"{', '.join(f'{d} {v}' for d, v in PINNED.items())})",
            hint=_INSTALL,
        ) from None
    warning = version_warning(dist, installed, PINNED[dist])
    if warning:
        log.warning("%s", warning)
    return installed


def _upstream(name: str) -> Any:
    """The upstream object `name` (a `_WHERE` row), its package's version checked first."""
    return _load(*_WHERE[name], name)


@functools.cache
def _load(dist: str, module: str, name: str) -> Any:
    installed = check_version(dist)
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise StageError(
            f"{dist} {installed} has no {module}.{name} ({e}); qwenquant calls the internals of {dist} {PINNED[dist]}",
            hint=_INSTALL,
        ) from None


# --- the recipe as llm-compressor reads it


def build_modifier(q: QuantizationSpec) -> Any:
    """The GPTQModifier the recipe's `quantization` section describes (W4A16 preset + overrides)."""
    return _upstream("GPTQModifier")(
        targets=list(q.targets),
        scheme=q.scheme,
        ignore=list(q.ignore),
        dampening_frac=q.dampening_frac,
        block_size=q.block_size,
        actorder=q.actorder,
    )


def resolve_scheme(q: QuantizationSpec) -> Any:
    """The QuantizationScheme GPTQModifier builds from the recipe's `quantization` section."""
    config = build_modifier(q).resolve_quantization_config()
    groups = list(config.config_groups.values())
    if len(groups) != 1:
        raise ValueError(f"expected one config group from the recipe, got {len(groups)}")
    return groups[0]


def oneshot(**kwargs: Any) -> Any:
    """llm-compressor's whole-model `oneshot` (the gptq stage's `oneshot` engine)."""
    return _upstream("oneshot")(**kwargs)


# --- GPTQ of a set of Linears, the steps GPTQModifier takes per subgraph


def empty_hessian(module: torch.nn.Module) -> torch.Tensor:
    """A zero Hessian accumulator for `module`'s input width, on its weight's device."""
    return _upstream("make_empty_hessian")(module, device=module.weight.device)


def accumulate_hessian(
    x: torch.Tensor, module: torch.nn.Module, hessian: torch.Tensor, count: torch.Tensor, precision: str = "tensor-core"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fold one input batch of `module` into its un-normalised Hessian sum and sample count (in place).
    `precision` "fp32" is llm-compressor's function; "tensor-core" (module docstring) applies to
    Linears fed bf16/fp16 inputs, anything else goes to llm-compressor's function too."""

    if precision == "fp32" or not _half_linear(x, module):
        return _upstream("accumulate_hessian")(x, module, hessian, count)
    if precision != "tensor-core":
        raise ValueError(f"hessian precision must be tensor-core or fp32, got {precision!r}")
    x = x.to(device=hessian.device)
    # llm-compressor's batch count: the leading dimension of a >= 3-d input, 1 for a 2-d one
    count += x.shape[0] if x.dim() > 2 else 1
    hessian.add_(gram(x.reshape(-1, x.shape[-1]), "tensor-core"), alpha=2)
    return hessian, count


def gram(x: torch.Tensor, precision: str = "tensor-core") -> torch.Tensor:
    """x^T x in float32 for rows x [N, D]: in llm-compressor's float32 arithmetic ("fp32": float32
    copies, TF32 as the process set it), or ("tensor-core") bf16/fp16 rows multiplied as they are
    with float32 output (tensor cores on CUDA; float32 copies of the same values on the CPU)."""
    import torch

    if precision == "tensor-core" and x.dtype in (torch.bfloat16, torch.float16):
        if x.is_cuda:
            return torch.mm(x.t(), x, out_dtype=torch.float32)
        x = x.float()
        return x.t() @ x
    x = x.float()
    return x.t() @ x


def _half_linear(x: torch.Tensor, module: torch.nn.Module) -> bool:
    import torch

    return isinstance(module, torch.nn.Linear) and x.dtype in (torch.bfloat16, torch.float16)


def prepare_module(module: torch.nn.Module, scheme: Any) -> None:
    """Attach the scheme's quantization parameters to a Linear, its quantized forward disabled
    (calibration forwards run the unquantized weight, as llm-compressor's DisableQuantization)."""
    _upstream("initialize_module_for_quantization")(module, scheme.model_copy(deep=True), force_zero_point=True)
    _upstream("disable_quantization")(module)


def gptq_modules(
    modules: list[torch.nn.Module],
    hessians: dict[torch.nn.Module, torch.Tensor],
    counts: dict[torch.nn.Module, torch.Tensor],
    *,
    block_size: int,
    dampening_frac: float,
    batched: Any = "auto",
) -> list[torch.nn.Module]:
    """GPTQ on `modules` (prepared, calibrated): weight observers, then batches of GPTQ; each
    weight is replaced by its fake-quantized value and its scale / zero point set. Consumes their
    entries of `hessians` / `counts`. Returns the modules whose Hessian was not positive definite
    (rounded to nearest instead)."""
    import torch

    getattr_chain = _upstream("getattr_chain")
    prepare_batch, quantize_weight = _upstream("prepare_batch"), _upstream("quantize_weight")
    for mod in modules:
        _upstream("initialize_observer")(mod, "weight")
    _upstream("observe")(modules, base_name="weight")
    fell_back = []
    for batch in _upstream("assign_batches")(modules, batched, block_size):
        qargs = getattr_chain(batch[0], "quantization_scheme.weights")
        qparams = [m.weight_observer.get_qparams() for m in batch]
        weights, batch_h, scales, zps, gscales = prepare_batch(batch, qparams, hessians, counts)
        quantized, _losses, fallback = quantize_weight(
            weights=weights,
            hessians=batch_h,
            scale=scales,
            zero_point=zps,
            global_scale=gscales,
            quant_args=qargs,
            blocksize=block_size,
            percdamp=dampening_frac,
        )
        fell_back += [batch[i] for i in torch.nonzero(fallback).flatten().tolist()]
        _upstream("update_batch_qparams")(batch, quantized, scales, zps, gscales, qargs)
        del weights, batch_h, quantized
    return fell_back


# --- the checkpoint format (compressed-tensors `pack-quantized`)


def pack_module(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A quantized Linear's checkpoint tensors (weight_packed int32, weight_scale, weight_shape; no
    zero point when symmetric), by compressed-tensors' packing compressor."""
    state = {
        "weight": module.weight.data,
        "weight_scale": module.weight_scale.data,
        "weight_zero_point": module.weight_zero_point.data,
    }
    return _compressor().compress(state, module.quantization_scheme)


def unpack(packed: dict[str, torch.Tensor], scheme: Any) -> torch.Tensor:
    """The dequantized weight compressed-tensors loads from a module's packed tensors."""
    return _compressor().decompress(dict(packed), scheme)["weight"]


def unpack_group(packed: dict[str, torch.Tensor], group: dict[str, Any]) -> torch.Tensor:
    """`unpack` with the scheme given as a config.json config group."""
    scheme = _upstream("QuantizationScheme")(**{k: v for k, v in group.items() if k != "format"})
    return unpack(packed, scheme)


def pack_int32(ints: torch.Tensor, num_bits: int) -> torch.Tensor:
    """Integer codes packed eight (int4) to an int32 along the last dimension, as compressed-tensors does."""
    return _upstream("pack_to_int32")(ints, num_bits)


def unpack_int32(packed: torch.Tensor, num_bits: int, shape: torch.Size) -> torch.Tensor:
    """The signed integer codes [rows, cols] (int8) that `pack_int32` packed, as compressed-tensors unpacks them."""
    return _upstream("unpack_from_int32")(packed, num_bits, shape)


def _compressor() -> Any:
    return _upstream("BaseCompressor").get_value_from_registry(PACKED_FORMAT)


def weight_scheme(
    targets: Iterable[str], *, num_bits: int, symmetric: bool, group_size: int, actorder: str | None, observer: str
) -> dict[str, Any]:
    """A static int group weight-only config group, `pack-quantized`, as config.json keeps it."""
    weights = _upstream("QuantizationArgs")(
        num_bits=num_bits,
        type="int",
        symmetric=symmetric,
        strategy="group",
        group_size=group_size,
        dynamic=False,
        actorder=actorder,
        observer=observer,
    )
    return _upstream("QuantizationScheme")(targets=list(targets), weights=weights, format=PACKED_FORMAT).model_dump(
        mode="json"
    )


def quantization_config(scheme: Any) -> dict[str, Any]:
    """config.json's `quantization_config` as `save_pretrained(save_compressed=True)` writes it
    (compressed-tensors `ModelCompressor.update_config`); `ignore` is filled in by the caller."""
    s = scheme.model_copy(deep=True)
    s.format = PACKED_FORMAT
    cfg = _upstream("QuantizationConfig")(
        config_groups={"group_0": s},
        format=PACKED_FORMAT,
        quantization_status=_upstream("QuantizationStatus").COMPRESSED,
        ignore=[],
    )
    return {
        "version": _upstream("__version__"),
        "quant_method": "compressed-tensors",
        "sparsity_config": {},
        "transform_config": {},
        **cfg.model_dump(exclude=["quant_method"]),
    }
