"""The plan's Gated DeltaNet prefill transient: the term pinned to its figure, the limits it sets,
and the shipped profiles' promises (all on the real Qwen3.8-27B config shipped in the package).

The figures are literals with their derivation beside them (not computed by the code under test).
They come from the kernel's tensor sizes until benchmarks/gdn_transient.py has measured them on a GPU;
then TOKEN_SCALE / SEQ_SCALE in qwenquant/plan/transient.py change and so must these numbers.
"""

from __future__ import annotations

import json

import pytest

from qwenquant import data_path
from qwenquant.cli import main
from qwenquant.plan import transient
from qwenquant.plan.artifact import make_plan
from qwenquant.plan.budget import CacheSettings, GiB, make_budget
from qwenquant.plan.weights import QuantSettings, model_shape, weights_from_config
from qwenquant.recipe import list_recipes, load_recipe

CONFIG = data_path("qwen3_8-27b.config.json")


@pytest.fixture(scope="module")
def shape():
    return model_shape(json.loads(CONFIG.read_text()))


def test_the_term_is_pinned_to_its_figure(shape) -> None:
    """Change TOKEN_SCALE / SEQ_SCALE (a measurement) and this test says by how much the plan moved."""
    # measured on an H200 (benchmarks/gdn_transient.py --kernel fla): the derived figures times measured / derived
    assert (transient.TOKEN_SCALE, transient.SEQ_SCALE) == (133_892 / 139_264, 5_445_547 / 7_864_320)
    # derived: 8 kd 16,384 + 12 vd 73,728 + A 256*48 = 12,288 + w 2*48*128 = 12,288 + h 48*128*128/32 = 24,576
    # = 139,264; measured 133,892 (0.961 of it)
    assert transient.gdn_token_bytes(shape) == 133_892
    # derived: 10 x 48 x 128 x 128 = 7,864,320 (the gathered initial and the final fp32 state, one more
    # chunk state); measured 5,445,547 per extra sequence of an 8192-token burst
    assert transient.gdn_seq_bytes(shape) == 5_445_547
    # 2048 x 133,892 + 5,445,547 = 279,656,363 (0.260 GiB); 16 new prompts: + 15 x 5,445,547
    assert transient.gdn_transient(shape, 2048) == 279_656_363
    assert transient.gdn_transient(shape, 2048, 16) == 361_339_568
    # a public 3090 report: a burst of 64 new prompts needed about 650 MiB more; 8192-token step here
    assert transient.gdn_transient(shape, 8192, 64) == 8192 * 133_892 + 64 * 5_445_547  # 1.35 GiB
    # tensor parallel over 2: half the heads on each GPU
    assert transient.gdn_token_bytes(shape, 2) == 66_946 and transient.gdn_seq_bytes(shape, 2) == 2_722_774
    assert transient.gdn_transient(shape, 0) == 0


def _budget(shape, util: float, chunk: int, seqs: int, max_len: int = 32768):
    recipe = load_recipe("w4a16-int4head")
    w = weights_from_config(shape, QuantSettings.from_recipe(recipe.canonical()))
    return make_budget(
        shape,
        w,
        CacheSettings("auto", "float16", "align", 3),
        device="cuda",
        total_bytes=24 * GiB,
        utilization=util,
        max_model_len=max_len,
        max_num_seqs=seqs,
        max_num_batched_tokens=chunk,
    )


def test_headroom_is_what_vllm_leaves_outside_its_budget(shape) -> None:
    b = _budget(shape, 0.92, 2048, 1)
    f = transient.fill(b, shape)
    # 24 GiB - int(24 GiB x 0.92) 23,708,219,473 - the context 536,870,912
    assert f.headroom == 25_769_803_776 - 23_708_219_473 - 536_870_912
    assert f.holds and f.largest_prompt == 32768 and f.largest_burst == 1


def test_a_chunk_that_does_not_fit_limits_the_prompt_and_names_the_fix(shape) -> None:
    """At 0.97 only 0.22 GiB is left outside the budget: a 2048-token chunk (0.27 GiB) does not fit."""
    b = _budget(shape, 0.97, 2048, 16, max_len=8192)
    assert b.fits
    f = transient.fill(b, shape)
    assert f.headroom == 25_769_803_776 - int(24 * GiB * 0.97) - 536_870_912
    assert not f.chunk_fits and not f.burst_fits
    # (headroom - 7,864,320) // 139,264 tokens fit in one step
    assert f.largest_prompt == (f.headroom - 5_445_547) // 133_892
    assert f.largest_burst == 0
    assert transient.fill_fix(b, f).startswith("lower --gpu-memory-utilization to 0.")
    assert "or --max-num-batched-tokens to 1024" in transient.fill_fix(b, f)
    b = _budget(shape, 0.96, 2048, 64, max_len=8192)  # 0.46 GiB: one sequence fits, 64 new prompts do not
    f = transient.fill(b, shape)
    assert f.chunk_fits and not f.burst_fits
    assert f.largest_burst == (f.headroom - 2048 * 133_892) // 5_445_547


def test_every_shipped_profile_keeps_its_promise_on_24_gib() -> None:
    """max_num_seqs sequences of max_model_len fit at once, and the largest prefill step and burst fill."""
    for name, path in list_recipes().items():
        res = make_plan(CONFIG, 24 * GiB, recipe_name=str(path))
        assert set(res.budgets) >= {"single-user", "batch", "long-context"}, name
        for prof, b in res.budgets.items():
            f = transient.fill(b, res.shape)
            assert b.fits and b.fits_all_seqs, (name, prof, b.concurrency)
            assert f.holds and f.largest_burst == b.max_num_seqs, (name, prof, f)
    lc = make_plan(CONFIG, 24 * GiB).budgets["long-context"]
    assert lc.max_model_len == 90112 and lc.cache.n_attn_layers == 17  # MTP on: the drafter's layer too
    assert lc.cache.kv_bytes_per_token_layer == 2 * 4 * 256 * 1  # fp8
    assert lc.largest_len(1) >= lc.max_model_len


def test_plan_shows_the_largest_prompt_and_burst(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(CONFIG), "--profile", "batch"]) == 0
    out = capsys.readouterr().out
    assert "GDN prefill transient, 1024-token chunk" in out and "not in vLLM's budget" in out
    assert "largest single prompt that fills: 4,096 tokens; largest burst: 16 new prompt(s) in one step" in out
    assert main(["plan", str(CONFIG), "--json"]) == 0
    fills = {k: v["fill"] for k, v in json.loads(capsys.readouterr().out)["profiles"].items()}
    assert fills["long-context"]["largest_prompt"] == 90112 and all(f["holds"] for f in fills.values())
    assert fills["batch"]["burst_transient_bytes"] == 1024 * 133_892 + 16 * 5_445_547
