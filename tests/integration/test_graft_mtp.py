"""`qwenquant graft-mtp` on checkpoints built without GPTQ (fast): restore, repair, refuse."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from helpers import INDEX, mtp_bytes, qq, strip_mtp, write_test_manifest


@pytest.fixture
def quantized_like(tiny_checkpoint: Path, tmp_path: Path) -> Path:
    """The tiny checkpoint with a quantization_config (ignore list without mtp) and no MTP tensors."""
    art = Path(shutil.copytree(tiny_checkpoint, tmp_path / "art"))
    cfg = json.loads((art / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "compressed-tensors", "ignore": ["re:.*visual.*"], "config_groups": {}}
    (art / "config.json").write_text(json.dumps(cfg))
    strip_mtp(art)
    return art


def test_graft_restores_bytes_index_and_ignore(quantized_like: Path, tiny_checkpoint: Path) -> None:
    assert mtp_bytes(quantized_like) == {}
    proc = qq("graft-mtp", str(quantized_like), "--source", str(tiny_checkpoint))
    assert proc.returncode == 0, proc.stderr
    got, want = mtp_bytes(quantized_like), mtp_bytes(tiny_checkpoint)
    assert len(want) == 15 and got == want
    index = json.loads((quantized_like / INDEX).read_text())["weight_map"]
    assert all(index[n] == "model-mtp.safetensors" for n in want)
    assert "re:^mtp.*" in json.loads((quantized_like / "config.json").read_text())["quantization_config"]["ignore"]

    files = {p.name: p.read_bytes() for p in quantized_like.iterdir()}
    again = qq("graft-mtp", str(quantized_like), "--source", str(tiny_checkpoint))
    assert again.returncode == 0 and "nothing to graft" in again.stdout
    assert {p.name: p.read_bytes() for p in quantized_like.iterdir()} == files


def test_graft_replaces_a_corrupted_mtp_tensor(quantized_like: Path, tiny_checkpoint: Path) -> None:
    assert qq("graft-mtp", str(quantized_like), "--source", str(tiny_checkpoint)).returncode == 0
    shard = quantized_like / "model-mtp.safetensors"
    data = bytearray(shard.read_bytes())
    data[-2] ^= 0x55
    shard.write_bytes(bytes(data))
    check = qq("graft-mtp", str(quantized_like), "--source", str(tiny_checkpoint), "--check-only")
    assert check.returncode == 5 and "replace 1" in check.stderr
    assert qq("graft-mtp", str(quantized_like), "--source", str(tiny_checkpoint)).returncode == 0
    assert mtp_bytes(quantized_like) == mtp_bytes(tiny_checkpoint)


def test_graft_refreshes_the_manifest(quantized_like: Path, tiny_checkpoint: Path) -> None:
    from qwenquant.manifest import load_manifest, verify_artifact

    write_test_manifest(quantized_like)
    before = load_manifest(quantized_like).root_digest
    proc = qq("graft-mtp", str(quantized_like), "--source", str(tiny_checkpoint))
    assert proc.returncode == 0, proc.stderr
    assert verify_artifact(quantized_like).ok
    m = load_manifest(quantized_like)
    assert m.root_digest != before and "model-mtp.safetensors" in {f.path for f in m.files}
    assert m.extra["repairs"][0]["graft_mtp"].startswith("add 15")


def test_graft_refuses_to_bless_other_drifted_files(quantized_like: Path, tiny_checkpoint: Path) -> None:
    write_test_manifest(quantized_like)
    body = sorted(p for p in quantized_like.glob("model-0*.safetensors"))[0]
    body.write_bytes(body.read_bytes()[:-1] + b"\x00")
    manifest = (quantized_like / "qwenquant-manifest.json").read_bytes()
    proc = qq("graft-mtp", str(quantized_like), "--source", str(tiny_checkpoint))
    assert proc.returncode == 4, proc.stderr
    assert body.name in proc.stderr and "re-run `qwenquant quantize`" in proc.stderr.replace("\n", " ")
    assert (quantized_like / "qwenquant-manifest.json").read_bytes() == manifest
    assert mtp_bytes(quantized_like) == {}


def test_graft_needs_real_folders(tmp_path: Path, tiny_checkpoint: Path) -> None:
    proc = qq("graft-mtp", str(tmp_path), "--source", str(tiny_checkpoint))
    assert proc.returncode == 5 and "has no config.json" in proc.stderr
