"""Two artifacts of the same source and recipe, compared tensor by tensor: the `quantize --gpus N`
tolerance against the one-process artifact (docs/distributed-gptq.md).

An N-process gptq stage sums each Hessian in another association of the same float additions,
so GPTQ may round some weights the other way, and its error feedback carries a flipped code into
the columns after it (and the changed layer outputs into the next layers and the lm_head
Hessian). Scales are computed from the weights alone before GPTQ, so they do not move. Hence:
  - byte-identical: every tensor but the int4 codes (`*.weight_packed`): scales, shapes, every
    unquantized tensor (embeddings, norms, conv, in_proj_a/b, vision, MTP), and every top-level
    file but the shards, the manifest and the quality report (config, index, tokenizer files);
  - within `TOLERANCE`: the int4 codes of the quantized Linears and of the lm_head.
docs/distributed-gptq.md states the same for users.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# Bounds, each on what a user would notice first:
#   first_layer_codes_fraction: codes that differ in decoder layer 0, the one layer whose inputs are
#     the same in both runs (the Hessian sum's association alone; a lost or doubled sample moves far more);
#   weight_error_ratio: per quantized module, ||W - dequant||_F / ||W||_F of the N-process artifact
#     within this fraction of the one-process artifact's (what the int4 codes cost, not which they are;
#     seen: 0.35 % at most on the tiny model, 0.42 % on a 4-layer, 512-token model where 18 % of codes differ).
# Codes that differ overall and the largest difference in steps are reported, not bounded: GPTQ's error
# feedback turns one flipped code into many and layer 0's few flips into different inputs for every
# later layer (on the tiny model, 2 CPU processes: 1.9 % of codes, at most 2 steps).
TOLERANCE = {"first_layer_codes_fraction": 0.01, "weight_error_ratio": 0.02}
MAY_DIFFER_FILES = ("qwenquant-manifest.json", "qwenquant-quality.json")
CODES = ".weight_packed"
FIRST_LAYER = re.compile(r"(^|\.)layers\.0\.")


@dataclass
class ArtifactDiff:
    codes_total: int = 0
    codes_differing: int = 0
    max_steps: int = 0
    first_layer_codes: list[int] = field(default_factory=lambda: [0, 0])  # differing, total
    modules: dict[str, tuple[float, int]] = field(default_factory=dict)  # differing codes: fraction, max steps
    weight_errors: dict[str, tuple[float, float]] = field(default_factory=dict)  # module: (a's, b's)
    not_identical: list[str] = field(default_factory=list)  # tensors / files that must be byte-identical

    @property
    def codes_fraction(self) -> float:
        return self.codes_differing / self.codes_total if self.codes_total else 0.0

    @property
    def first_layer_fraction(self) -> float:
        k, n = self.first_layer_codes
        return k / n if n else 0.0

    def worst_error_ratio(self) -> float:
        """The largest |e_b / e_a - 1| over the modules whose codes differ."""
        return max((abs(eb / ea - 1) if ea else 0.0 for ea, eb in self.weight_errors.values()), default=0.0)

    def problems(self, tol: dict[str, float] | None = None) -> list[str]:
        """Every way this difference exceeds the tolerance (empty: within it)."""
        tol = tol or TOLERANCE
        out = [f"{n} differs (must be byte-identical)" for n in self.not_identical]
        if self.first_layer_fraction > tol["first_layer_codes_fraction"]:
            out.append(
                f"{self.first_layer_fraction:.2%} of decoder layer 0's int4 codes differ "
                f"(tolerance {tol['first_layer_codes_fraction']:.0%})"
            )
        for m, (ea, eb) in sorted(self.weight_errors.items()):
            if ea and abs(eb / ea - 1) > tol["weight_error_ratio"]:
                out.append(f"{m}: weight error {eb:.4g} against {ea:.4g} (tolerance {tol['weight_error_ratio']:.0%})")
        return out

    def to_dict(self) -> dict[str, object]:
        return {
            "codes_total": self.codes_total,
            "codes_differing": self.codes_differing,
            "codes_fraction": self.codes_fraction,
            "max_steps": self.max_steps,
            "first_layer_codes_fraction": self.first_layer_fraction,
            "worst_weight_error_ratio": self.worst_error_ratio(),
            "modules_with_differences": len(self.modules),
            "not_identical": self.not_identical,
            "modules": {
                m: {"codes_fraction": f, "max_steps": k, "weight_error": self.weight_errors.get(m)}
                for m, (f, k) in sorted(self.modules.items())
            },
        }


def _device() -> str:
    """Where the comparison's arithmetic runs: a GPU when there is one (a 27B-shaped artifact's
    codes are billions of nibbles), else the CPU."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def int4_codes(raw: bytes, device: str = "cpu") -> torch.Tensor:
    """The 4-bit codes of pack-quantized `weight_packed` bytes ([rows, cols/8] little-endian int32,
    eight codes per word from the low nibble up: byte by byte, low nibble first), flat, as int16.
    Offset binary: a difference of codes is a difference in quantization steps."""
    import torch

    b = torch.frombuffer(bytearray(raw), dtype=torch.uint8).to(device)
    return torch.stack([b & 0xF, b >> 4], dim=-1).reshape(-1).to(torch.int16)


def compare_artifacts(
    a: Path, b: Path, source: Path | None = None, progress: Callable[[str], None] | None = None
) -> ArtifactDiff:
    """How artifact `b` differs from `a` (see the module docstring for what may differ); with the
    `source` checkpoint also each differing module's weight error in both. `progress`: called with
    a line after each quantized module."""
    from qwenquant.checkpoint.tensorfile import checkpoint_refs, checkpoint_shards

    a, b = Path(a), Path(b)
    diff = ArtifactDiff()
    shards = {p.name for p in checkpoint_shards(a)} | {p.name for p in checkpoint_shards(b)}
    files = {p.name for p in a.iterdir() if p.is_file()} | {p.name for p in b.iterdir() if p.is_file()}
    for name in sorted(files - shards - set(MAY_DIFFER_FILES)):
        pa, pb = a / name, b / name
        if not (pa.is_file() and pb.is_file()) or pa.read_bytes() != pb.read_bytes():
            diff.not_identical.append(name)
    ra, rb = checkpoint_refs(a), checkpoint_refs(b)
    src = checkpoint_refs(source) if source else None
    device = _device()
    for name in sorted(set(ra) | set(rb)):
        if name not in ra or name not in rb or (ra[name].dtype, ra[name].shape) != (rb[name].dtype, rb[name].shape):
            diff.not_identical.append(name)
            continue
        da, db = ra[name].read(), rb[name].read()
        if da != db and not name.endswith(CODES):
            diff.not_identical.append(name)
        elif name.endswith(CODES):
            _count_codes(diff, name, da, db, ra, rb, src, device)
            if progress:
                m = name[: -len(CODES)]
                progress(f"{m}: {diff.modules.get(m, (0.0, 0))[0]:.2%} of codes differ")
    return diff


def _count_codes(
    diff: ArtifactDiff,
    name: str,
    da: bytes,
    db: bytes,
    ra: dict,
    rb: dict,
    src: dict | None,
    device: str = "cpu",
    chunk_bytes: int = 1 << 26,
) -> None:
    mod = name[: -len(CODES)]
    n = 2 * len(da)
    k, top = 0, 0
    if da != db:
        for o in range(0, len(da), chunk_bytes):  # a multiple of 4: whole int32 words
            steps = (int4_codes(da[o : o + chunk_bytes], device) - int4_codes(db[o : o + chunk_bytes], device)).abs()
            k += int(steps.count_nonzero())
            top = max(top, int(steps.max()))
        diff.modules[mod] = (k / n, top)
        if src is not None:
            diff.weight_errors[mod] = (_module_error(mod, da, ra, src, device), _module_error(mod, db, rb, src, device))
    diff.codes_total += n
    diff.codes_differing += k
    diff.max_steps = max(diff.max_steps, top)
    if FIRST_LAYER.search(mod):
        diff.first_layer_codes[0] += k
        diff.first_layer_codes[1] += n


def _module_error(
    mod: str, packed: bytes, refs: dict, src: dict, device: str = "cpu", rows_per_chunk: int = 4096
) -> float:
    """||W - dequant||_F / ||W||_F of one module against its source weight (text-only or multimodal
    names), symmetric group-wise int4 (value = (code - 8) x group scale), a few thousand rows at a
    time (the 27B's lm_head is 1.3 G weights)."""
    import torch

    from qwenquant.modeling.text import ref_tensor

    w = src.get(f"{mod}.weight") or src.get(f"{mod.replace('model.', 'model.language_model.', 1)}.weight")
    if w is None:
        return 0.0
    rows, cols = w.shape
    scale = ref_tensor(refs[f"{mod}.weight_scale"]).to(device, torch.float32)
    weight = ref_tensor(w)  # the source weight on the host, its dtype checked
    group = cols // scale.shape[1]
    err = ref = 0.0
    for r0 in range(0, rows, rows_per_chunk):
        r1 = min(rows, r0 + rows_per_chunk)
        codes = int4_codes(packed[r0 * cols // 2 : r1 * cols // 2], device).reshape(r1 - r0, cols)
        wr = weight[r0:r1].to(device, torch.float32)
        deq = ((codes.float() - 8).view(r1 - r0, -1, group) * scale[r0:r1].unsqueeze(-1)).view(r1 - r0, cols)
        err += float(torch.linalg.vector_norm(wr - deq, dtype=torch.float64)) ** 2
        ref += float(torch.linalg.vector_norm(wr, dtype=torch.float64)) ** 2
    return (err**0.5) / max(ref**0.5, 1e-30)
