"""What a quantize reads to hash, on the tiny model in-process: each file version and tensor byte
range once per run (the stages share the run's digest cache, hashing.DigestCache), every artifact
file again in the final verify, and a source tensor changed in place between two stages is read
again and caught."""

from __future__ import annotations

import sys
import threading
from collections import Counter
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

RECIPE = "w4a16-int4head-multimodal"  # multimodal: later stages hard-link the gptq stage's shards


def _options(source: Path, out: Path):  # -> pipeline.QuantizeOptions
    from qwenquant.quantize.pipeline import QuantizeOptions
    from qwenquant.recipe import load_calibration_override, load_recipe

    return QuantizeOptions(
        source, load_recipe(RECIPE), load_calibration_override("tiny-demo"), out, device="cpu", source_unverified=True
    )


def _count_reads(monkeypatch: pytest.MonkeyPatch) -> tuple[Counter, Counter]:
    """Wrap hashing.sha256_file and hashing.sha256_range, the two functions every file byte a
    quantize hashes goes through, in hashing and in every qwenquant module that imported them by
    name; count reads per (file version, start, end), apart for those inside verify_artifact."""
    from qwenquant import hashing, manifest
    from qwenquant.quantize.stages import PIPELINE  # noqa: F401  (every stage module imported before patching)

    run, verify = Counter(), Counter()
    verifying, lock = [False], threading.Lock()  # the hashing runs on thread pools
    real_file, real_range, real_verify = hashing.sha256_file, hashing.sha256_range, manifest.verify_artifact

    def count(p: Path, start: int, end: int) -> None:
        key = (hashing.file_key(p), start, end)
        with lock:
            (verify if verifying[0] else run)[key] += 1

    def sha256_file(p: Path, progress=None) -> str:
        count(p, 0, Path(p).stat().st_size)
        return real_file(p, progress)

    def sha256_range(p: Path, start: int, end: int) -> str:
        count(p, start, end)
        return real_range(p, start, end)

    def verify_artifact(folder: Path):
        verifying[0] = True
        try:
            return real_verify(folder)
        finally:
            verifying[0] = False

    for name, mod in list(sys.modules.items()):
        if name.startswith("qwenquant") and mod is not None:
            for attr, real, fake in (
                ("sha256_file", real_file, sha256_file),
                ("sha256_range", real_range, sha256_range),
            ):
                if getattr(mod, attr, None) is real:
                    monkeypatch.setattr(mod, attr, fake)
    monkeypatch.setattr(manifest, "verify_artifact", verify_artifact)
    return run, verify


def test_a_quantize_hashes_each_file_and_tensor_once_then_verifies_every_file(
    tiny_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from qwenquant.hashing import file_key
    from qwenquant.manifest import list_artifact_files
    from qwenquant.quantize.pipeline import quantize

    run, verify = _count_reads(monkeypatch)
    res = quantize(_options(tiny_checkpoint, tmp_path / "art"))
    again = {k: n for k, n in run.items() if n > 1}
    assert not again, f"hashed more than once outside verify: {again}"
    layer_files = (tmp_path / "art.work" / "gptq").glob("model-*.safetensors")
    assert all(run[(file_key(p), 0, p.stat().st_size)] == 1 for p in layer_files)  # written, hashed, reused
    files = list_artifact_files(res.artifact)
    assert set(verify) == {(file_key(p), 0, p.stat().st_size) for p in files.values()}
    assert set(verify.values()) == {1}


def test_a_source_tensor_changed_in_place_after_the_gptq_stage_fails_the_check(tiny_copy: Path, tmp_path: Path) -> None:
    """The gptq stage's proof hashed the source's embeddings; the check stage's proof must read
    them again once the file changed (new mtime), not reuse the digest, and fail the build."""
    from qwenquant.checkpoint.tensorfile import checkpoint_refs
    from qwenquant.errors import CheckError
    from qwenquant.quantize.pipeline import quantize
    from qwenquant.quantize.stage import Stage
    from qwenquant.quantize.stages import PIPELINE

    name = "model.language_model.embed_tokens.weight"
    ref = checkpoint_refs(tiny_copy)[name]

    def tamper_then_check(ctx, out: Path) -> dict:
        with open(ref.path, "r+b") as f:  # same size, one byte flipped, in place (same inode)
            f.seek(ref.start)
            b = f.read(1)
            f.seek(ref.start)
            f.write(bytes([b[0] ^ 0xFF]))
        return check.run(ctx, out)

    check = next(s for s in PIPELINE if s.name == "check")
    stages = [Stage(s.name, s.inputs, s.params, tamper_then_check) if s is check else s for s in PIPELINE]
    with pytest.raises(CheckError, match=rf"unquantized-identical: {name}: bytes differ from source tensor"):
        quantize(_options(tiny_copy, tmp_path / "art"), stages=stages)
