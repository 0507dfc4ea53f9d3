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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

# Codes that differ from the one-process artifact: overall, in any one module, and by how many
# quantization steps at most (seen on the tiny model, 2 CPU processes: 1.9 %, 11.2 %, 2 steps).
TOLERANCE = {"codes_fraction": 0.10, "module_codes_fraction": 0.25, "max_steps": 3}
MAY_DIFFER_FILES = ("qwenquant-manifest.json", "qwenquant-quality.json")
CODES = ".weight_packed"


@dataclass
class ArtifactDiff:
    codes_total: int = 0
    codes_differing: int = 0
    max_steps: int = 0
    modules: dict[str, tuple[float, int]] = field(default_factory=dict)  # differing codes: fraction, max steps
    not_identical: list[str] = field(default_factory=list)  # tensors / files that must be byte-identical

    @property
    def codes_fraction(self) -> float:
        return self.codes_differing / self.codes_total if self.codes_total else 0.0

    def problems(self, tol: dict[str, float] | None = None) -> list[str]:
        """Every way this difference exceeds the tolerance (empty: within it)."""
        tol = tol or TOLERANCE
        out = [f"{n} differs (must be byte-identical)" for n in self.not_identical]
        if self.codes_fraction > tol["codes_fraction"]:
            out.append(f"{self.codes_fraction:.2%} of int4 codes differ (tolerance {tol['codes_fraction']:.0%})")
        out += [f"{m}: {f:.2%} of its int4 codes differ (tolerance {tol['module_codes_fraction']:.0%})"
                for m, (f, _) in sorted(self.modules.items()) if f > tol["module_codes_fraction"]]
        if self.max_steps > tol["max_steps"]:
            out.append(f"an int4 code differs by {self.max_steps} steps (tolerance {tol['max_steps']})")
        return out

    def to_dict(self) -> dict[str, object]:
        return {"codes_total": self.codes_total, "codes_differing": self.codes_differing,
                "codes_fraction": self.codes_fraction, "max_steps": self.max_steps,
                "modules_with_differences": len(self.modules), "not_identical": self.not_identical}


def int4_codes(raw: bytes) -> "np.ndarray":  # noqa: F821
    """The eight 4-bit codes of every int32 of a pack-quantized `weight_packed` (offset binary,
    so a difference of codes is a difference in quantization steps)."""
    import numpy as np

    words = np.frombuffer(raw, dtype="<u4")
    return np.stack([(words >> (4 * k)) & 0xF for k in range(8)]).astype(np.int8)


def compare_artifacts(a: Path, b: Path) -> ArtifactDiff:
    """How artifact `b` differs from `a` (see the module docstring for what may differ)."""
    import numpy as np

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
    for name in sorted(set(ra) | set(rb)):
        if name not in ra or name not in rb:
            diff.not_identical.append(name)
            continue
        ta, tb = ra[name], rb[name]
        if (ta.dtype, ta.shape) != (tb.dtype, tb.shape):
            diff.not_identical.append(name)
            continue
        da, db = ta.read(), tb.read()
        if da == db:
            if name.endswith(CODES):
                diff.codes_total += 8 * ta.nbytes // 4
            continue
        if not name.endswith(CODES):
            diff.not_identical.append(name)
            continue
        steps = np.abs(int4_codes(da).astype(np.int16) - int4_codes(db))
        n, k, top = steps.size, int(np.count_nonzero(steps)), int(steps.max())
        diff.codes_total += n
        diff.codes_differing += k
        diff.max_steps = max(diff.max_steps, top)
        diff.modules[name[: -len(CODES)]] = (k / n, top)
    return diff
