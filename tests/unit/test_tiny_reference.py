"""The committed trained reference model: sha256-checked on load, laid out like the random builder,
and it has learned its corpus (held-out perplexity far below the uniform 4096)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from qwenquant.errors import QwenquantError
from qwenquant.testbed.tiny import reference_model
from qwenquant.testbed.tiny.build import MTP_SHARD, read_index


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return reference_model.build_reference_checkpoint(tmp_path_factory.mktemp("ref") / "ckpt")


def test_layout_matches_the_random_builder_and_is_reproducible(
    checkpoint: Path, tiny_checkpoint: Path, tmp_path: Path
) -> None:
    assert sorted(p.name for p in checkpoint.iterdir()) == sorted(p.name for p in tiny_checkpoint.iterdir())
    index = read_index(checkpoint)
    assert sorted(n for n, f in index.items() if f == MTP_SHARD) == sorted(n for n in index if n.startswith("mtp."))
    assert len([n for n in index if n.startswith("mtp.")]) == 15
    assert set(index) == set(read_index(tiny_checkpoint))  # same tensor names, other dims
    again = reference_model.build_reference_checkpoint(tmp_path / "again")
    assert _digests(again) == _digests(checkpoint)
    cfg = json.loads((checkpoint / "config.json").read_text())["text_config"]
    assert (cfg["vocab_size"], cfg["hidden_size"], cfg["intermediate_size"]) == (4096, 256, 768)


def test_every_quantized_width_is_a_multiple_of_128(checkpoint: Path) -> None:
    from safetensors import safe_open

    for shard in sorted(set(read_index(checkpoint).values())):
        with safe_open(str(checkpoint / shard), "pt") as f:
            for name in f.keys():
                shape = f.get_slice(name).get_shape()
                if len(shape) == 2 and "visual" not in name and "in_proj_a" not in name and "in_proj_b" not in name:
                    assert shape[0] % 128 == 0 and shape[1] % 128 == 0, (name, shape)


def test_a_changed_byte_is_refused(tmp_path: Path) -> None:
    copy = tmp_path / "data"
    shutil.copytree(reference_model.data_dir(), copy)
    blob = bytearray((copy / "model.safetensors").read_bytes())
    blob[-1] ^= 1
    (copy / "model.safetensors").write_bytes(bytes(blob))
    reference_model.reference_meta(copy)  # untouched files still load
    with pytest.raises(QwenquantError, match="does not match its sha256"):
        reference_model.reference_tensors(copy)


def test_the_model_has_learned_its_corpus(checkpoint: Path) -> None:
    import torch

    from qwenquant.evaluate import metrics
    from qwenquant.evaluate.forward import DenseForward
    from qwenquant.evaluate.weights import load_dense

    cfg, tensors = load_dense(checkpoint)
    fwd = DenseForward(cfg, tensors)
    ids = reference_model.heldout_ids()[:4, :128]
    hidden = fwd.final_hidden(ids)
    nll = metrics.window_nll((hidden @ tensors["lm_head.weight"].T)[:, :-1], ids[:, 1:])
    ppl = float(torch.exp(nll.mean()))
    meta = reference_model.reference_meta()
    assert ppl < 250, ppl  # uniform over the vocab would be 4096; training measured about 134
    mtp = fwd.mtp_hidden(ids, hidden) @ tensors["lm_head.weight"].T
    greedy = (hidden @ tensors["lm_head.weight"].T).argmax(-1)
    agree = float((mtp.argmax(-1) == greedy[:, 1:]).float().mean())
    assert agree > 0.3, agree  # a random MTP head agrees about 1/4096 of the time
    assert meta["corpus_sha256"] and meta["python"].startswith("3.11")
