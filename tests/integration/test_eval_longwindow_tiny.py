"""`qwenquant eval offline` at the longest window a model has positions for, through the layer-streamed
forward (the 27B's path at 32K and 128K), on the committed tiny reference: max_position_embeddings 4096,
so its longest window is 4096 tokens, cut from the pinned depth text (`--text-set depth`, 82,171 tokens
with its tokenizer).

The "artifact" is a stand-in: the reference with every decoder-layer matrix moved by seeded noise and a
manifest recording the reference as its source (no GPTQ run: quantizing the tiny model costs minutes on a
shared CPU, and the packed int4 path of both forwards is test_eval_reference.py's at 96 tokens).

Quality at depth is not measured here (the tiny model is a test bed); what is tested is that the path
runs at that length and gives the dense forward's figures on the same windows.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from helpers import flat, qq, write_source_manifest

pytestmark = pytest.mark.slow
LONGEST = 4096  # the tiny reference's max_position_embeddings


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    import torch
    from safetensors.torch import load_file, save_file

    from qwenquant.testbed.tiny import reference_model

    root = tmp_path_factory.mktemp("evallong")
    source = reference_model.build_reference_checkpoint(root / "source")
    art = Path(shutil.copytree(source, root / "artifact"))
    gen = torch.Generator().manual_seed(0)
    for shard in sorted(art.glob("*.safetensors")):
        tensors = load_file(shard)
        for name, t in tensors.items():
            if ".layers." in name and t.ndim == 2 and t.is_floating_point():
                noise = torch.randn(t.shape, generator=gen) * 0.05 * t.float().std()
                tensors[name] = (t.float() + noise).to(t.dtype)
        save_file(tensors, shard, metadata={"format": "pt"})
    write_source_manifest(art, source, {"name": "none"})
    return {"source": source, "artifact": art}


def _offline(models: dict[str, Path], *extra: str) -> tuple[int, str, str]:
    r = qq(
        "eval",
        "offline",
        str(models["artifact"]),
        "--reference",
        str(models["source"]),
        "--report",
        os.devnull,
        *extra,
        timeout=900,
    )
    return r.returncode, r.stdout, flat(r.stderr)


def test_the_longest_window_streamed_gives_the_dense_figures(models: dict[str, Path]) -> None:
    """Two windows of 4096 tokens (the model's every position) through the layer-streamed forward and
    through the dense one: KL, top-1, perplexity and MTP agreement agree to float tolerance."""
    common = ("--windows", "2", "--window-len", str(LONGEST), "--text-set", "depth", "--json")
    rc_s, out_s, err_s = _offline(models, *common, "--streamed")
    rc_d, out_d, err_d = _offline(models, *common, "--dense")
    assert (rc_s, rc_d) == (0, 0), (err_s + err_d)[-3000:]
    s, d = json.loads(out_s), json.loads(out_d)
    assert (s["forward"], d["forward"], s["window_len"], s["text"]) == ("streamed", "dense", LONGEST, "depth")
    for arm in ("w4a16-body", "w4a16+rtn-head", "artifact"):
        for key in ("ppl", "kl", "top1", "kl_p99"):
            assert s["arms"][arm][key] == pytest.approx(d["arms"][arm][key], rel=1e-4, abs=1e-6), (arm, key)
    assert s["arms"]["artifact"]["kl"] > 0  # the quantized arm differs from the source at depth
    assert s["mtp"]["artifact"]["agree"] == pytest.approx(d["mtp"]["artifact"]["agree"], abs=1e-5)
    assert s["lm_head"]["ratio"] == pytest.approx(d["lm_head"]["ratio"], rel=1e-4)


def test_a_window_past_the_models_positions_is_refused(models: dict[str, Path]) -> None:
    """One token more than max_position_embeddings: exit 2 before anything is measured, naming the limit."""
    rc, out, err = _offline(models, "--windows", "2", "--window-len", str(LONGEST + 1), "--text-set", "depth")
    assert rc == 2, err[-2000:]
    assert f"--window-len {LONGEST + 1} is longer than the model's max_position_embeddings ({LONGEST}," in err
    assert f"--window-len {LONGEST} or less" in err
    assert "logits" not in err  # refused before measuring


def test_a_text_too_short_for_the_windows_is_refused(models: dict[str, Path]) -> None:
    """The depth text holds 20 windows of 4096 tokens: asking for 21 is the one short-text rule (exit 2)."""
    rc, out, err = _offline(models, "--windows", "21", "--window-len", str(LONGEST), "--text-set", "depth")
    assert rc == 2, err[-2000:]
    assert "depth has 20 windows of 4096 tokens, fewer than --windows 21" in err
    assert "pass --windows 20 or less" in err


def test_the_shipped_held_out_text_points_to_a_longer_text(models: dict[str, Path]) -> None:
    """The tiny reference's own held-out windows are 257 tokens: a longer window is refused with a hint
    naming the texts that hold it."""
    rc, out, err = _offline(models, "--windows", "2", "--window-len", "1024")
    assert rc == 2, err[-2000:]
    assert "--window-len 1024 is longer than the shipped windows (257)" in err
    assert "--text-set depth" in err
