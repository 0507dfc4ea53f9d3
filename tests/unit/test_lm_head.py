"""The int4 lm_head: GPTQ math, chunking, packing and config against the real stack."""

from __future__ import annotations

import math

import pytest
import torch

from qwenquant.errors import StageError
from qwenquant.quantize.head_gptq import (
    HeadQuantSpec,
    QuantizedHead,
    accumulate_hessian,
    capture_final_hidden,
    compare_heads,
    gptq_quantize_rows,
    head_config_group,
    head_quality,
    pack_head,
    rtn_quantize_rows,
)

V, D, G = 512, 256, 128


def hidden_states(n: int, seed: int, *, dead: list[int] | None = None) -> torch.Tensor:
    """Correlated stand-ins for final-norm hidden states: a shared rank-24 subspace, one
    loud channel, noise. The basis is fixed; `seed` draws the tokens."""
    basis = torch.randn(24, D, generator=torch.Generator().manual_seed(1234))
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 24, generator=gen) @ basis + 0.5 * torch.randn(n, D, generator=gen)
    x[:, 7] *= 6.0
    if dead:
        x[:, dead] = 0.0
    return x


@pytest.fixture(scope="module")
def head() -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    return (torch.randn(V, D, generator=gen) * 0.04).to(torch.bfloat16)


def hessian_of(x: torch.Tensor, batch: int = 300) -> torch.Tensor:
    H, n = None, 0
    for b in x.split(batch):
        H, n = accumulate_hessian(H, b, n)
    assert n == x.shape[0]
    return H


@pytest.fixture(scope="module")
def calib_H() -> torch.Tensor:
    return hessian_of(hidden_states(2048, seed=1))


def test_accumulated_hessian_is_two_over_n_xtx() -> None:
    x = hidden_states(1000, seed=5)
    H = hessian_of(x, batch=128)
    ref = 2.0 * x.double().t() @ x.double() / x.shape[0]
    assert H.dtype == torch.float32
    torch.testing.assert_close(H.double(), ref, rtol=1e-5, atol=1e-4)


def test_chunked_gptq_equals_unchunked_exactly(head: torch.Tensor, calib_H: torch.Tensor) -> None:
    whole = gptq_quantize_rows(head, calib_H, row_chunk=V, device="cpu")
    calls: list[tuple[int, int]] = []
    chunked = gptq_quantize_rows(head, calib_H, row_chunk=64, device="cpu", progress=lambda d, t: calls.append((d, t)))
    assert torch.equal(whole.int, chunked.int)
    assert torch.equal(whole.scale, chunked.scale)
    assert calls == [(i, V // 64) for i in range(1, V // 64 + 1)]


def test_codes_in_int4_range_and_shapes(head: torch.Tensor, calib_H: torch.Tensor) -> None:
    for q in (gptq_quantize_rows(head, calib_H, row_chunk=100, device="cpu"), rtn_quantize_rows(head, device="cpu")):
        assert q.int.dtype == torch.int8 and tuple(q.int.shape) == (V, D)
        assert int(q.int.min()) >= -8 and int(q.int.max()) <= 7
        assert int(q.int.min()) == -8 or int(q.int.max()) == 7
        assert q.scale.dtype == torch.bfloat16 and tuple(q.scale.shape) == (V, D // G)


def test_scales_match_compressed_tensors_minmax(head: torch.Tensor) -> None:
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.utils import calculate_qparams

    args = QuantizationArgs(num_bits=4, symmetric=True, strategy="group", group_size=G)
    groups = head.unflatten(-1, (-1, G))
    scale, zp = calculate_qparams(groups.amin(-1), groups.amax(-1), args)
    q = rtn_quantize_rows(head, device="cpu")
    assert scale.dtype == torch.bfloat16
    assert torch.equal(q.scale, scale)
    assert not zp.any()
    # RTN codes are compressed-tensors' own quantize of the weight, divided in fp32 as GPTQ
    # does (a bf16 weight / bf16 scale division rounds the quotient first and can flip ties)
    from compressed_tensors.quantization.lifecycle.forward import quantize

    assert torch.equal(q.int, quantize(head.float(), scale, zp, args, dtype=torch.int8))
    bf16_path = quantize(head, scale, zp, args, dtype=torch.int8)
    assert (bf16_path != q.int).float().mean() < 0.01


def test_gptq_beats_rtn_on_held_out_hidden_states(head: torch.Tensor, calib_H: torch.Tensor) -> None:
    gptq = gptq_quantize_rows(head, calib_H, row_chunk=128, device="cpu")
    rtn = rtn_quantize_rows(head, device="cpu")
    held_out = hidden_states(1024, seed=99)
    result = compare_heads(head, rtn, gptq, held_out, chunk=256, vocab_chunk=200)
    assert result["gptq"]["kl"] < 0.7 * result["rtn"]["kl"]
    assert result["kl_reduction_pct"] > 30
    assert result["gptq"]["top1"] >= result["rtn"]["top1"]


def test_head_quality_matches_dense_computation(head: torch.Tensor) -> None:
    rtn = rtn_quantize_rows(head, device="cpu")
    h = hidden_states(300, seed=7)
    got = head_quality(head, rtn, h, chunk=128, vocab_chunk=96)
    a = h.double() @ head.double().t()
    b = h.double() @ rtn.dequantize().double().t()
    kl = (torch.softmax(a, 1) * (torch.log_softmax(a, 1) - torch.log_softmax(b, 1))).sum(1).mean()
    top1 = (a.argmax(1) == b.argmax(1)).double().mean()
    assert got["kl"] == pytest.approx(float(kl), rel=1e-4)
    assert got["top1"] == pytest.approx(float(top1))
    assert head_quality(head, head, h)["kl"] == pytest.approx(0.0, abs=1e-6)


def test_pack_round_trips_through_compressed_tensors(head: torch.Tensor, calib_H: torch.Tensor) -> None:
    from compressed_tensors.compressors import PackedQuantizationCompressor
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32
    from compressed_tensors.quantization import QuantizationScheme

    q = gptq_quantize_rows(head, calib_H, row_chunk=256, device="cpu")
    packed = pack_head(q, prefix="model.lm_head")
    assert set(packed) == {"model.lm_head.weight_packed", "model.lm_head.weight_scale", "model.lm_head.weight_shape"}
    wp = packed["model.lm_head.weight_packed"]
    assert wp.dtype == torch.int32 and tuple(wp.shape) == (V, D // 8)
    assert packed["model.lm_head.weight_shape"].tolist() == [V, D]
    assert packed["model.lm_head.weight_shape"].dtype == torch.int64

    assert torch.equal(unpack_from_int32(wp, 4, torch.Size([V, D])), q.int)

    scheme = QuantizationScheme.model_validate(head_config_group())
    state = {k.removeprefix("model.lm_head."): v for k, v in packed.items()}
    out = PackedQuantizationCompressor.decompress(state, scheme)
    assert out["weight"].dtype == torch.bfloat16
    assert torch.equal(out["weight"], q.dequantize())

    # llm-compressor saves the fake-quantized bf16 weight and compressed-tensors re-quantizes it:
    # that path must give back the same bytes.
    again = PackedQuantizationCompressor.compress({"weight": q.dequantize(), "weight_scale": q.scale}, scheme)
    assert torch.equal(again["weight_packed"], wp)
    assert "weight_zero_point" not in again


def test_pack_order_is_low_nibble_first() -> None:
    ints = torch.tensor([[-8, -7, 0, 1, 2, 3, 4, 7] * 16], dtype=torch.int8)
    q = QuantizedHead(ints, torch.ones(1, 1, dtype=torch.bfloat16), num_bits=4, group_size=128)
    word = int(pack_head(q)["lm_head.weight_packed"][0, 0]) & 0xFFFFFFFF
    # value + 8, element i in bits [4i, 4i + 4)
    assert word == sum((v + 8) << (4 * i) for i, v in enumerate([-8, -7, 0, 1, 2, 3, 4, 7]))


def test_config_group_matches_what_llm_compressor_writes() -> None:
    from compressed_tensors.quantization import QuantizationConfig, QuantizationScheme
    from compressed_tensors.utils.match import match_name

    group = head_config_group(HeadQuantSpec())
    # observed in config.json of llm-compressor 0.14.0.1 oneshot(GPTQModifier) with a
    # `re:.*lm_head$` group (actorder there was its default, "static")
    assert group == {
        "targets": ["re:.*lm_head$"],
        "weights": {
            "num_bits": 4,
            "type": "int",
            "symmetric": True,
            "group_size": 128,
            "strategy": "group",
            "block_structure": None,
            "dynamic": False,
            "actorder": None,
            "scale_dtype": None,
            "zp_dtype": None,
            "observer": "memoryless_minmax",
            "observer_kwargs": {},
        },
        "input_activations": None,
        "output_activations": None,
        "format": "pack-quantized",
    }
    assert head_config_group(HeadQuantSpec(actorder=True))["weights"]["actorder"] == "static"
    assert head_config_group({"num_bits": 4, "group_size": 64, "symmetric": True})["weights"]["group_size"] == 64
    scheme = QuantizationScheme.model_validate(group)
    assert scheme.weights.num_bits == 4 and scheme.weights.group_size == 128
    config = QuantizationConfig.model_validate(
        {"config_groups": {"group_1": group}, "format": "pack-quantized", "quant_method": "compressed-tensors"}
    )
    assert config.config_groups["group_1"].targets == ["re:.*lm_head$"]
    for name in ("lm_head", "language_model.lm_head", "model.language_model.lm_head"):
        assert match_name(name, "re:.*lm_head$")
    assert not match_name("lm_head.foo", "re:.*lm_head$")


def test_dead_columns_are_zeroed_like_llm_compressor(head: torch.Tensor) -> None:
    dead = [3, 100, 200]
    H = hessian_of(hidden_states(2048, seed=1, dead=dead))
    assert all(H[i, i] == 0 for i in dead)
    q = gptq_quantize_rows(head, H, row_chunk=200, device="cpu")
    assert not q.int[:, dead].any()
    assert not q.used_rtn_fallback
    # scales still come from the original weights, dead columns included (observer runs first)
    assert torch.equal(q.scale, rtn_quantize_rows(head, device="cpu").scale)


@pytest.mark.parametrize("actorder", [False, True])
def test_matches_llm_compressor_quantize_weight(head: torch.Tensor, actorder: bool) -> None:
    """The whole head through llm-compressor's own GPTQ (one batch) against ours in 8 row
    chunks, same H (one dead column) and observer scales: identical bf16 weights."""
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.utils import calculate_qparams
    from llmcompressor.modifiers.gptq.gptq_quantize import quantize_weight

    H = hessian_of(hidden_states(2048, seed=1, dead=[5]))
    args = QuantizationArgs(
        num_bits=4, symmetric=True, strategy="group", group_size=G, actorder="static" if actorder else None
    )
    groups = head.unflatten(-1, (-1, G))
    scale, zp = calculate_qparams(groups.amin(-1), groups.amax(-1), args)
    theirs, _, fallback = quantize_weight(
        head.unsqueeze(0).clone(),
        H.unsqueeze(0).clone(),
        scale.unsqueeze(0),
        zp.unsqueeze(0),
        None,
        args,
        blocksize=128,
        percdamp=0.01,
    )
    assert not fallback.any()
    ours = gptq_quantize_rows(head, H, row_chunk=64, actorder=actorder, device="cpu")
    assert torch.equal(ours.scale, scale)
    # Same ops in the same order on the same device. The one difference, addmm_(alpha=-1)
    # for the block error instead of bmm then subtract, rounds the same here; on another
    # BLAS it could flip a rare code by one step.
    assert torch.equal(ours.dequantize(), theirs[0])


def test_singular_hessian_falls_back_to_rtn(head: torch.Tensor) -> None:
    H = -torch.eye(D)  # not positive definite even after damping
    q = gptq_quantize_rows(head, H, device="cpu")
    assert q.used_rtn_fallback
    assert torch.equal(q.int, rtn_quantize_rows(head, device="cpu").int)


def test_bad_group_size_names_the_fix(head: torch.Tensor, calib_H: torch.Tensor) -> None:
    with pytest.raises(StageError, match="group_size must divide the hidden size 256, got 96"):
        gptq_quantize_rows(head, calib_H, group_size=96)
    with pytest.raises(StageError, match="symmetric"):
        rtn_quantize_rows(head, symmetric=False)


def test_caller_weight_is_not_modified(calib_H: torch.Tensor) -> None:
    W = torch.randn(64, D) * 0.04
    before = W.clone()
    gptq_quantize_rows(W, calib_H, row_chunk=32, device="cpu")
    assert torch.equal(W, before)


def _tiny_qwen35():
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    cfg = Qwen3_5TextConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=2,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        layer_types=["linear_attention", "full_attention"],
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    return Qwen3_5ForCausalLM(cfg).eval()


def test_capture_final_hidden_is_exactly_lm_head_input() -> None:
    model = _tiny_qwen35()
    ids = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0  # left padding
    got: list[torch.Tensor] = []
    n = capture_final_hidden(model, [{"input_ids": ids, "attention_mask": mask}, ids[:1]], got.append)
    assert n == 12 + 7 and [t.shape[0] for t in got] == [12, 7]
    with torch.no_grad():
        full = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        last = model.model(input_ids=ids, attention_mask=mask).last_hidden_state
    # what the head saw gives exactly the model's logits, and equals the final norm's output
    assert torch.equal(got[0], last[mask.bool()])
    assert torch.equal(model.lm_head(got[0]), full.logits[mask.bool()])
    assert math.isfinite(float(got[1].sum()))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_sweep_agrees_with_cpu(head: torch.Tensor, calib_H: torch.Tensor) -> None:
    cpu = gptq_quantize_rows(head, calib_H, row_chunk=128, device="cpu")
    gpu = gptq_quantize_rows(head, calib_H.cuda(), row_chunk=128, device="cuda")
    assert gpu.int.device.type == "cpu" and torch.equal(gpu.scale, cpu.scale)
    # different BLAS, so a rare code may differ by one step
    assert (gpu.int != cpu.int).float().mean() < 1e-3


@pytest.mark.parametrize("row_chunk", [1, 37, 100000])
def test_packing_in_row_chunks_gives_the_bytes_of_packing_the_whole_head(
    head: torch.Tensor, calib_H: torch.Tensor, row_chunk: int
) -> None:
    """The lm_head stage packs a row chunk at a time (on the GPU when there is one) to keep the host
    peak down; the bytes are those compressed-tensors' packer gives for the whole head at once."""
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

    q = rtn_quantize_rows(head, row_chunk=128, device="cpu")
    got = pack_head(q, row_chunk=row_chunk, device="cpu")["lm_head.weight_packed"]
    assert torch.equal(got, pack_to_int32(q.int, 4))


def test_kl_compare_dequantizes_row_slices_to_the_same_figures(head: torch.Tensor) -> None:
    """compare_heads dequantizes a QuantizedHead one vocabulary slice at a time (the host never holds
    a whole dequantized head): the figures equal those from the fully dequantized weights."""
    rtn = rtn_quantize_rows(head, device="cpu")
    gptq_like = rtn_quantize_rows(head * 1.01, device="cpu")
    h = hidden_states(300, seed=5)
    sliced = compare_heads(head, rtn, gptq_like, h, chunk=128, vocab_chunk=96)
    dense = compare_heads(head, rtn.dequantize(), gptq_like.dequantize(), h, chunk=128, vocab_chunk=96)
    assert sliced == dense


def _head_spec(method: str = "gptq") -> object:
    """The LmHeadSpec fields quantize_head reads."""
    from types import SimpleNamespace

    return SimpleNamespace(method=method, num_bits=4, group_size=G, symmetric=True, dampening_frac=0.01, block_size=128)


@pytest.mark.parametrize("method", ["gptq", "rtn"])
def test_stage_tensors_and_figures_do_not_depend_on_the_row_chunk(
    head: torch.Tensor, calib_H: torch.Tensor, method: str
) -> None:
    """Rows are independent under one shared Hessian: two row chunks give the same packed bytes,
    scales and KL figures, and those of quantizing, comparing and packing whole heads."""
    from qwenquant.quantize.head_gptq import quantize_head

    h = hidden_states(300, seed=5)
    runs = [quantize_head(lambda: head, calib_H, h, _head_spec(method), row_chunk=rc, device="cpu") for rc in (64, V)]
    gptq = gptq_quantize_rows(head, calib_H, row_chunk=8192, device="cpu")
    rtn = rtn_quantize_rows(head, row_chunk=8192, device="cpu")
    whole = pack_head(gptq if method == "gptq" else rtn, device="cpu")
    report = compare_heads(head, rtn, gptq, h)
    for run in runs:
        assert run.tensors.keys() == whole.keys()
        assert all(torch.equal(run.tensors[k], whole[k]) for k in whole)
        assert run.report == report
        assert set(run.seconds) == {"gptq", "rtn", "compare", "pack"}


def test_rtn_head_reads_the_rows_of_the_dequantized_rtn_head(head: torch.Tensor) -> None:
    from qwenquant.quantize.head_gptq import RtnHead

    dense = rtn_quantize_rows(head, device="cpu").dequantize()
    lazy = RtnHead(head, 4, G, "cpu")
    assert lazy.shape == (V, D)
    assert torch.equal(torch.cat([lazy[0:100], lazy[100:V]]), dense)


def test_a_refusing_gate_stops_the_head_with_its_error(head: torch.Tensor, calib_H: torch.Tensor) -> None:
    from qwenquant.quantize.head_gptq import quantize_head

    def refuse(report: dict) -> None:
        raise StageError(f"gptq KL {report['gptq']['kl']}")

    with pytest.raises(StageError, match="gptq KL"):
        quantize_head(
            lambda: head, calib_H, hidden_states(50, seed=5), _head_spec(), row_chunk=V, device="cpu", gate=refuse
        )


def test_raw_bytes_without_a_copy_are_the_copied_bytes() -> None:
    from qwenquant.checkpoint.assemble import torch_raw

    t = torch.arange(-40, 40, dtype=torch.int32).reshape(10, 8)
    shared, copied = torch_raw("x", t, copy=False), torch_raw("x", t)
    assert shared.nbytes == copied.nbytes == 320
    assert bytes(shared.read()) == copied.read()
