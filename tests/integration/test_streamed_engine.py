"""The streamed engine against llm-compressor `oneshot` on the tiny model, on the CPU.

Same math: both run llm-compressor 0.14's GPTQ on the same calibration tokens, batch 1, eager
attention, quantized outputs propagated to the next layer. The reference is `oneshot` with its
`norm_calibration_context` replaced by a no-op: that context (docs/known-issues.md#norm-rounding)
rounds every offset-norm weight through bf16 as (1 + w) during calibration, so stock oneshot
calibrates on slightly different norms than the checkpoint has; the streamed engine calibrates on
the checkpoint's own norms. With that one difference removed the packed weights, scales and shapes
must be byte-identical (samples are fed in llm-compressor's LengthAwareSampler order, longest
first, since a Hessian is a float sum whose bits depend on its order).

Against stock oneshot (rounding on) GPTQ's column-by-column error feedback turns the tiny norm
change into many flipped int4 codes (about 37% on this random-weights model, 3% by more than one
step), so codes are not comparable there; what is compared is what matters: identical scales
(they depend on the weights alone) and, per module, the weight-space quantization error
||W - dequant(packed)|| within 5% of stock oneshot's (observed: within 1.4%).
"""

from __future__ import annotations

import contextlib
import json
import random
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def _samples() -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(5, 1000) for _ in range(rng.randrange(20, 60))] for _ in range(6)]


def _oneshot(
    source: Path, out: Path, samples: list[list[int]], *, norm_rounding: bool, max_seq_length: int = 64
) -> dict:
    import importlib

    import transformers
    from datasets import Dataset
    from llmcompressor import oneshot

    from qwenquant.modeling.compat import build_modifier
    from qwenquant.modeling.runtime import set_deterministic
    from qwenquant.recipe import load_recipe

    entry = importlib.import_module("llmcompressor.entrypoints.oneshot")  # the module, not the function
    set_deterministic(threads=2)
    q = load_recipe("w4a16-int4head").quantization
    model = transformers.Qwen3_5ForConditionalGeneration.from_pretrained(str(source), dtype="auto").eval()
    ds = Dataset.from_dict({"input_ids": samples, "attention_mask": [[1] * len(s) for s in samples]})
    saved = entry.norm_calibration_context
    if not norm_rounding:
        entry.norm_calibration_context = lambda model: contextlib.nullcontext()
    try:
        oneshot(
            model=model,
            processor=transformers.AutoTokenizer.from_pretrained(str(source)),
            dataset=ds,
            recipe=build_modifier(q),
            sequential_targets=list(q.sequential_targets),
            pipeline="sequential",
            num_calibration_samples=len(samples),
            max_seq_length=max_seq_length,
            shuffle_calibration_samples=False,
            batch_size=1,
        )
    finally:
        entry.norm_calibration_context = saved
    model.save_pretrained(str(out), save_compressed=True)
    return _quant_tensors(out)


def _quant_tensors(folder: Path) -> dict:
    from qwenquant.checkpoint.tensorfile import checkpoint_refs

    return {
        n: (r.dtype, r.shape, r.read())
        for n, r in checkpoint_refs(folder).items()
        if n.rsplit(".", 1)[1] in ("weight_packed", "weight_scale", "weight_shape")
    }


def _stream(source: Path, layers: Path):  # -> engine.run.StreamResult
    from qwenquant.checkpoint.tensorfile import checkpoint_refs
    from qwenquant.modeling.runtime import set_deterministic
    from qwenquant.modeling.text import open_source
    from qwenquant.quantize.engine.run import stream_quantize
    from qwenquant.recipe import load_recipe

    set_deterministic(threads=2)
    src = open_source(source, checkpoint_refs(source))
    # llm-compressor's own Hessian arithmetic (fp32), the path that is byte-identical to oneshot
    q = load_recipe("w4a16-int4head").with_hessian_precision("fp32").quantization
    return stream_quantize(src, _samples(), q, layers, fingerprint="test", device="cpu", heldout=[5])


@pytest.fixture(scope="module")
def streamed(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    from qwenquant.checkpoint.tensorfile import shard_refs

    root = tmp_path_factory.mktemp("streamed")
    res = _stream(tiny_checkpoint, root / "layers")
    got = {}
    for f in res.layer_files:
        got.update(
            {
                n: (r.dtype, r.shape, r.read())
                for n, r in shard_refs(f).items()
                if n.rsplit(".", 1)[1] in ("weight_packed", "weight_scale", "weight_shape")
            }
        )
    return {"tensors": got, "root": root, "result": res}


def test_packed_weights_identical_to_oneshot_without_norm_rounding(
    streamed: dict, tiny_checkpoint: Path, tmp_path: Path
) -> None:
    ref = _oneshot(tiny_checkpoint, tmp_path / "oneshot", _samples(), norm_rounding=False)
    got = streamed["tensors"]
    assert sorted(got) == sorted(ref) and len(ref) == 3 * 25
    differ = [n for n in ref if got[n] != ref[n]]
    assert differ == [], f"{len(differ)} of {len(ref)} tensors differ from oneshot, all: {differ}"


def test_quantization_config_matches_oneshot(tiny_checkpoint: Path, tmp_path: Path) -> None:
    """config.json's quantization_config equals the one `save_pretrained(save_compressed=True)`
    wrote, except `ignore` (both pipelines write the recipe's patterns there)."""
    from qwenquant.modeling.compat import quantization_config, resolve_scheme
    from qwenquant.recipe import load_recipe

    _oneshot(tiny_checkpoint, tmp_path / "oneshot", _samples()[:1], norm_rounding=False)
    ref = json.loads((tmp_path / "oneshot" / "config.json").read_text())["quantization_config"]
    got = quantization_config(resolve_scheme(load_recipe("w4a16-int4head").quantization))
    ref.pop("ignore"), got.pop("ignore")
    assert got == ref


def test_close_to_stock_oneshot_with_norm_rounding(streamed: dict, tiny_checkpoint: Path, tmp_path: Path) -> None:
    import torch

    from qwenquant.modeling.text import TORCH_DTYPES

    def t(entry: tuple) -> torch.Tensor:
        dtype, shape, data = entry
        return torch.frombuffer(bytearray(data), dtype=TORCH_DTYPES[dtype]).reshape(shape)

    from qwenquant.checkpoint.tensorfile import checkpoint_refs
    from qwenquant.modeling.compat import resolve_scheme, unpack
    from qwenquant.recipe import load_recipe

    scheme = resolve_scheme(load_recipe("w4a16-int4head").quantization)
    source = checkpoint_refs(tiny_checkpoint)
    ref = _oneshot(tiny_checkpoint, tmp_path / "stock", _samples(), norm_rounding=True)
    got = streamed["tensors"]
    worst = 0.0
    for mod in sorted({n.rsplit(".", 1)[0] for n in ref}):
        parts = [".weight_packed", ".weight_scale", ".weight_shape"]
        a = {p[1:]: t(ref[mod + p]) for p in parts}
        b = {p[1:]: t(got[mod + p]) for p in parts}
        assert torch.equal(a["weight_scale"], b["weight_scale"]), f"{mod}: scales come from the weights alone"
        w = t((source[mod + ".weight"].dtype, source[mod + ".weight"].shape, source[mod + ".weight"].read())).float()
        e_ref = (w - unpack(a, scheme).float()).norm().item()
        e_got = (w - unpack(b, scheme).float()).norm().item()
        worst = max(worst, abs(e_got / e_ref - 1))
    print(f"stock oneshot vs streamed: weight-space quantization error within {worst:.2%} per module")
    assert worst <= 0.05, f"a module's quantization error differs by {worst:.2%} from stock oneshot's"


def test_head_calibration_from_the_same_pass(streamed: dict) -> None:
    """Held-out sample 5 is kept apart; the other samples' tokens fold into the head's Hessian."""
    head = streamed["result"].head
    lengths = [len(s) for s in _samples()]
    assert head.tokens == sum(lengths[:5]) and head.heldout.shape[0] == lengths[5] and head.heldout_samples == 1
    assert head.hessian.shape == (256, 256)


def test_layer_phases_account_for_each_layer(streamed: dict) -> None:
    """Every decoder layer reports where its time went (the figures `--verbose` logs per layer and
    benchmarks/quantize_bench.py tabulates): the one-process phases, in order, adding up to the layer's
    time (the rest is bookkeeping between phases)."""
    res = streamed["result"]
    assert len(res.phases) == len(res.seconds_per_layer) == len(res.layer_files)
    for phases, seconds in zip(res.phases, res.seconds_per_layer, strict=True):
        assert list(phases) == ["read", "build", "calibrate", "gptq", "write", "rebuild", "forward"]
        assert all(v >= 0 for v in phases.values())
        assert 0.7 * seconds <= sum(phases.values()) <= seconds, (phases, seconds)


def test_layer_write_overlaps_the_next_steps_and_its_failure_surfaces(
    streamed: dict, tiny_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Layer 1's write is held until layer 1 has been forwarded (possible only when the write runs
    beside the loop and the layer is rebuilt without reading its file back), then fails between its
    tensors file and its record. The run raises that error; layer 1 has no record and nothing after
    it was written; the re-run resumes at layer 1 and ends on the uninterrupted run's bytes."""
    import threading

    from qwenquant.quantize.engine import layers as L
    from qwenquant.quantize.engine import run

    forwards, forwarded = [], threading.Event()
    real_forward, real_write, real_atomic = run._forward_all, L.write_layer, L.atomic_write_bytes

    def forward(*a, keep: bool, **k) -> None:
        real_forward(*a, keep=keep, **k)
        forwards.append(keep)
        if forwards.count(True) == 2:  # layer 1's outputs, the next layer's inputs
            forwarded.set()

    def write(root: Path, i: int, *a) -> Path:
        if i == 1:
            assert forwarded.wait(20), "layer 1 was not forwarded while its write was held"
        return real_write(root, i, *a)

    def atomic(path: Path, data: bytes) -> None:
        if path == L.layer_dir(tmp_path / "layers", 1) / L.RECORD:
            raise OSError(28, "No space left on device (simulated)")
        real_atomic(path, data)

    monkeypatch.setattr(run, "_forward_all", forward)
    monkeypatch.setattr(L, "write_layer", write)
    monkeypatch.setattr(L, "atomic_write_bytes", atomic)
    with pytest.raises(OSError, match=r"No space left on device \(simulated\)"):
        _stream(tiny_checkpoint, tmp_path / "layers")
    assert (L.layer_dir(tmp_path / "layers", 1) / L.TENSORS).is_file()  # half-written: a file, no record
    assert not L.layer_dir(tmp_path / "layers", 2).exists()
    assert L.completed_layers(tmp_path / "layers", 4, "test") == (1, "no record")

    monkeypatch.undo()
    again = _stream(tiny_checkpoint, tmp_path / "layers")
    assert again.resumed_from == 1
    assert [f.read_bytes() for f in again.layer_files] == [f.read_bytes() for f in streamed["result"].layer_files]


def test_the_oneshot_engine_is_stock_oneshot(
    tiny_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`QWENQUANT_GPTQ_ENGINE=oneshot` (README: the gptq stage runs llm-compressor's whole-model `oneshot`
    instead): the pipeline's source, calibration and gptq stages run, and the gptq stage's packed tensors are
    the very bytes of stock `oneshot` + `save_pretrained` on the calibration tokens the run recorded."""
    from qwenquant.quantize.pipeline import QuantizeOptions, quantize
    from qwenquant.quantize.stages import PIPELINE
    from qwenquant.quantize.stages.calibration import load_tokens
    from qwenquant.recipe import load_calibration_override, load_recipe

    monkeypatch.setenv("QWENQUANT_GPTQ_ENGINE", "oneshot")
    work = tmp_path / "work"
    stages = [s for s in PIPELINE if s.name in ("source", "calibration", "gptq")]
    opts = QuantizeOptions(
        tiny_checkpoint,
        load_recipe("w4a16-int4head"),
        load_calibration_override("tiny-demo"),
        tmp_path / "art",
        work=work,
        device="cpu",
        source_unverified=True,
    )
    assert quantize(opts, stages=stages).stages == {"source": "ran", "calibration": "ran", "gptq": "ran"}
    samples = load_tokens(work / "calibration")
    ref = _oneshot(
        tiny_checkpoint, tmp_path / "stock", samples, norm_rounding=True, max_seq_length=max(len(s) for s in samples)
    )
    got = _quant_tensors(work / "gptq")
    assert sorted(got) == sorted(ref) and len(ref) == 3 * 25
    differ = [n for n in ref if got[n] != ref[n]]
    assert differ == [], f"{len(differ)} of {len(ref)} tensors differ from stock oneshot: {differ}"
