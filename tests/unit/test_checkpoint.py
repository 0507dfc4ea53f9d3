"""The byte-identity proof and deterministic shard writing (checkpoint/identity.py, checkpoint/tensorfile.py)."""

from __future__ import annotations

from qwenquant.checkpoint.identity import TensorDigest, compare_tensors, recipe_quantizes
from qwenquant.checkpoint.tensorfile import RawTensor, header_bytes, plan_shards


def _td(tag: str) -> TensorDigest:
    return TensorDigest("BF16", (2,), tag * 64)


def test_identity_proof_accepts_quantized_and_identical() -> None:
    src = {"a.norm.weight": _td("1"), "a.proj.weight": _td("2")}
    art = {"a.norm.weight": _td("1"), "a.proj.weight_packed": _td("3"), "a.proj.weight_scale": _td("4")}
    assert compare_tensors(src, art, rename=lambda n: n, may_quantize=recipe_quantizes([], head_quantized=True)) == []


def test_identity_proof_catches_rounded_norm_and_wrongly_quantized() -> None:
    src = {"a.norm.weight": _td("1"), "x.in_proj_a.weight": _td("2"), "gone.weight": _td("5")}
    art = {"a.norm.weight": _td("9"), "x.in_proj_a.weight_packed": _td("3"), "stray": _td("7")}
    problems = compare_tensors(
        src, art, rename=lambda n: n, may_quantize=recipe_quantizes(["re:.*in_proj_a$"], head_quantized=True)
    )
    text = "\n".join(problems)
    assert "a.norm.weight: bytes differ" in text
    assert "x.in_proj_a: quantized, but the recipe keeps it" in text
    assert "gone.weight: missing" in text
    assert "stray: in the artifact but not derived" in text


def test_shard_header_is_deterministic_and_aligned() -> None:
    ts = [RawTensor("b", "BF16", (2,), b"\x00" * 4), RawTensor("a", "I32", (1,), b"\x01" * 4)]
    h1, h2 = header_bytes(ts), header_bytes(list(reversed(ts)))
    assert h1 == h2 and (len(h1) - 8) % 8 == 0
    assert plan_shards({t.name: t for t in ts}, 4) == {
        "model-00001-of-00002.safetensors": ["a"],
        "model-00002-of-00002.safetensors": ["b"],
    }
