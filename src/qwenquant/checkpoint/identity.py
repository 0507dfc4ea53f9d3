"""Proof that every tensor the recipe does not quantize is byte-identical to the source.

llm-compressor 0.14 rounds offset-norm weights through bf16 while calibrating (docs/known-issues.md#norm-rounding), so
this is checked, never assumed: it runs after GPTQ and again on the final artifact, and any
difference fails the build. `compare_tensors` is pure (digests in, problems out).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from qwenquant.checkpoint.names import target_matches
from qwenquant.checkpoint.tensorfile import TensorRef, checkpoint_refs
from qwenquant.hashing import DigestCache

QUANT_PARAMS = ("weight_packed", "weight_scale", "weight_shape", "weight_zero_point", "weight_g_idx")


@dataclass(frozen=True)
class TensorDigest:
    dtype: str
    shape: tuple[int, ...]
    sha256: str


def quantized_module(name: str) -> str | None:
    """`x.weight_packed` -> `x` (for any quantization parameter), else None."""
    mod, _, leaf = name.rpartition(".")
    return mod if leaf in QUANT_PARAMS else None


def compare_tensors(
    source: Mapping[str, TensorDigest],
    artifact: Mapping[str, TensorDigest],
    *,
    rename: Callable[[str], str | None],
    may_quantize: Callable[[str], bool],
) -> list[str]:
    """Problems (empty = proven): unquantized tensors must match the source in dtype, shape, bytes.

    `rename(source_name)` gives the artifact name (None: dropped by the layout); `may_quantize(module)`
    says whether the recipe quantizes that source module.
    """
    problems: list[str] = []
    accounted: set[str] = set()
    artifact_modules = {m for n in artifact if (m := quantized_module(n))}
    for s_name in sorted(source):
        a_name = rename(s_name)
        if a_name is None:
            continue
        src = source[s_name]
        if a_name in artifact:
            accounted.add(a_name)
            got = artifact[a_name]
            if got.dtype != src.dtype or got.shape != src.shape:
                problems.append(
                    f"{a_name}: {got.dtype}{list(got.shape)} in the artifact, "
                    f"{src.dtype}{list(src.shape)} in the source"
                )
            elif got.sha256 != src.sha256:
                problems.append(f"{a_name}: bytes differ from source tensor {s_name}")
            continue
        a_mod = a_name[: -len(".weight")] if a_name.endswith(".weight") else None
        if a_mod is not None and a_mod in artifact_modules:
            s_mod = s_name[: -len(".weight")]
            if not may_quantize(s_mod):
                problems.append(f"{a_mod}: quantized, but the recipe keeps it in {src.dtype}")
            accounted.update(n for n in artifact if quantized_module(n) == a_mod)
            continue
        problems.append(f"{a_name}: missing from the artifact (source tensor {s_name})")
    for a_name in sorted(set(artifact) - accounted):
        problems.append(f"{a_name}: in the artifact but not derived from any source tensor")
    return problems


def tensor_digests(
    refs: Mapping[str, TensorRef], names: Iterable[str] | None = None, digests: DigestCache | None = None
) -> dict[str, TensorDigest]:
    """dtype, shape and sha256 of each tensor's raw bytes (streamed, on threads: hashlib releases the
    GIL). `digests`: the run's cache, so a tensor whose bytes were hashed earlier in the run (same
    file version, same range) is not read again; None: read every one."""
    from concurrent.futures import ThreadPoolExecutor

    cache = DigestCache.of(digests)
    todo = sorted(refs if names is None else names)

    def one(n: str) -> TensorDigest:
        r = refs[n]
        return TensorDigest(r.dtype, r.shape, cache.range(r.path, r.start, r.end))

    with ThreadPoolExecutor(max_workers=min(8, (os.cpu_count() or 2))) as pool:
        return dict(zip(todo, pool.map(one, todo), strict=True))


def _unhashed(r: TensorRef) -> TensorDigest:
    return TensorDigest(r.dtype, r.shape, "")


def recipe_quantizes(ignore: list[str], *, head_quantized: bool, mtp_quantized: bool = False) -> Callable[[str], bool]:
    """Whether the recipe quantizes a (source-named) Linear module: not ignored, or the head stage;
    an MTP Linear only with `mtp: {quantize: gptq}`."""

    def may(module: str) -> bool:
        if module == "lm_head" or module.endswith(".lm_head"):
            return head_quantized
        if module.startswith("mtp.") and not mtp_quantized:
            return False
        return not any(target_matches(p, module) for p in ignore)

    return may


def prove_unquantized_identical(
    artifact_dir: Path,
    source_dir: Path,
    *,
    rename: Callable[[str], str | None],
    may_quantize: Callable[[str], bool],
    skip_source: Callable[[str], bool] | None = None,
    digests: DigestCache | None = None,
) -> list[str]:
    """Compare raw safetensors bytes of the artifact against the source; return the problems
    (`digests`: the run's cache, see `tensor_digests`)."""
    src_refs = checkpoint_refs(source_dir)
    art_refs = checkpoint_refs(artifact_dir)
    keep = [n for n in src_refs if not (skip_source and skip_source(n))]
    # Only tensors stored unquantized on both sides are hashed (the quantized body is most bytes).
    plain = {n for n in art_refs if quantized_module(n) is None}
    src = {n: _unhashed(src_refs[n]) for n in keep}
    src.update(tensor_digests(src_refs, [n for n in keep if rename(n) in plain], digests))
    art = {n: _unhashed(r) for n, r in art_refs.items()}
    art.update(tensor_digests(art_refs, plain, digests))
    return compare_tensors(src, art, rename=rename, may_quantize=may_quantize)
