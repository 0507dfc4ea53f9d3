"""Linears fed the same input share one Hessian in the streamed engine (engine/quantize.LayerGPTQ):
the figures must be the bits llm-compressor's per-module hooks give, on the CPU, with the real
llm-compressor and compressed-tensors functions."""

from __future__ import annotations

import pytest
import torch


class Block(torch.nn.Module):
    """q/k/v read one tensor; o reads another; `other` reads a copy equal in value only."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(256, 128, bias=False) for _ in range(3))
        self.o = torch.nn.Linear(128, 256, bias=False)
        self.other = torch.nn.Linear(256, 128, bias=False)
        self.swap = False  # True: k reads another tensor (a model whose inputs are not fixed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x * 2
        y = self.q(h) + self.k(h * 1 if self.swap else h) + self.v(h)
        return self.o(y) + self.other(h.clone()).sum()


def _layer(seed: int = 0) -> tuple[Block, dict[str, torch.nn.Linear]]:
    torch.manual_seed(seed)
    b = Block()
    return b, {f"b.{n}": m for n, m in b.named_children()}


def _scheme():
    from qwenquant.modeling.compat import resolve_scheme
    from qwenquant.recipe import load_recipe

    return resolve_scheme(load_recipe("w4a16-int4head").quantization)


def _inputs() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randn(1, 40 + 7 * i, 256, generator=g) for i in range(4)]


def test_same_input_shares_one_hessian_with_the_same_bits() -> None:
    from llmcompressor.modifiers.gptq.helpers import accumulate_hessian, make_empty_hessian

    from qwenquant.quantize.engine.quantize import LayerGPTQ

    block, mods = _layer()
    gptq = LayerGPTQ(mods, _scheme(), block_size=128, dampening_frac=0.01)
    # llm-compressor's own per-module accumulation, on the same inputs, for comparison
    ref = {n: make_empty_hessian(m) for n, m in mods.items()}
    cnt = {n: torch.zeros(()) for n in mods}
    seen: dict[str, list[torch.Tensor]] = {n: [] for n in mods}
    taps = [m.register_forward_hook(lambda mod, a, o, n=n: seen[n].append(a[0])) for n, m in mods.items()]
    with torch.no_grad():
        for x in _inputs():
            block(x)
    for t in taps:
        t.remove()
    for n, m in mods.items():
        for a in seen[n]:
            ref[n], cnt[n] = accumulate_hessian(a, m, ref[n], cnt[n])

    assert {gptq.names[m]: gptq.names[p] for m, p in gptq.shared.items()} == {"b.k": "b.q", "b.v": "b.q"}
    for n, m in mods.items():
        assert torch.equal(gptq.hessians[m], ref[n]), n
        assert float(gptq.counts[m]) == float(cnt[n]) == 4
    assert gptq.hessians[mods["b.k"]] is gptq.hessians[mods["b.q"]]
    gptq.unshare()
    assert not gptq.shared and gptq.hessians[mods["b.k"]] is not gptq.hessians[mods["b.q"]]
    assert torch.equal(gptq.hessians[mods["b.k"]], ref["b.k"])


def test_shared_and_unshared_pack_the_same_bytes() -> None:
    """GPTQ from shared Hessians packs what it packs from each module's own copy."""
    from qwenquant.quantize.engine.quantize import LayerGPTQ

    packed = []
    for unshare in (False, True):
        block, mods = _layer()
        gptq = LayerGPTQ(mods, _scheme(), block_size=128, dampening_frac=0.01)
        with torch.no_grad():
            for x in _inputs():
                block(x)
        if unshare:
            gptq.unshare()
        packed.append(gptq.quantize())
    assert packed[0].keys() == packed[1].keys() == {"b.q", "b.k", "b.v", "b.o", "b.other"}
    for name in packed[0]:
        for leaf in packed[0][name]:
            assert torch.equal(packed[0][name][leaf], packed[1][name][leaf]), (name, leaf)


def test_a_later_sample_with_another_input_is_refused() -> None:
    from qwenquant.quantize.engine.quantize import LayerGPTQ

    block, mods = _layer()
    gptq = LayerGPTQ(mods, _scheme(), block_size=128, dampening_frac=0.01)
    xs = _inputs()
    with torch.no_grad():
        block(xs[0])
        assert set(gptq.shared) == {mods["b.k"], mods["b.v"]}
        block.swap = True
        with pytest.raises(RuntimeError, match="b.k shares its Hessian with b.q"):
            block(xs[1])


@pytest.mark.parametrize("shape", [(1, 37, 256), (37, 256), (2, 3, 11, 256)])
def test_tensor_core_hessian_keeps_llm_compressors_meaning(shape: tuple[int, ...]) -> None:
    """bf16 Linear inputs: "fp32" is llm-compressor's own function, bit for bit; "tensor-core" gives
    the same count and 2 x^T x of the same bf16 values (float32 products, another rounding), within
    float32 summation error of llm-compressor's sum."""
    from llmcompressor.modifiers.gptq.helpers import accumulate_hessian as upstream
    from llmcompressor.modifiers.gptq.helpers import make_empty_hessian

    from qwenquant.modeling.compat import accumulate_hessian

    mod = torch.nn.Linear(256, 8)
    g = torch.Generator().manual_seed(3)
    xs = [torch.randn(*shape, generator=g).to(torch.bfloat16) for _ in range(3)]
    res = {}
    for precision in ("upstream", "fp32", "tensor-core"):
        h, n = make_empty_hessian(mod), torch.zeros(())
        for x in xs:
            h, n = upstream(x, mod, h, n) if precision == "upstream" else accumulate_hessian(x, mod, h, n, precision)
        res[precision] = (h, float(n))
    assert torch.equal(res["fp32"][0], res["upstream"][0]) and res["fp32"][1] == res["upstream"][1]
    assert res["tensor-core"][1] == res["upstream"][1]
    rows = [x.reshape(-1, 256).float() for x in xs]
    exact = sum(2 * (r.double().t() @ r.double()) for r in rows)
    assert not torch.equal(res["tensor-core"][0], res["upstream"][0])  # another rounding, really taken
    for h, _ in res.values():
        assert torch.allclose(h.double(), exact, rtol=1e-5, atol=1e-3)
