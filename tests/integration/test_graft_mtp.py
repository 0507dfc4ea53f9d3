"""`qwenquant graft-mtp` on checkpoints built without GPTQ (fast): restore, repair, refuse."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import pytest

from helpers import INDEX, flat, mtp_bytes, qq, strip_mtp, write_source_manifest, write_test_manifest


@pytest.fixture
def quantized_like(tiny_checkpoint: Path, tmp_path: Path) -> Path:
    """The tiny checkpoint with a quantization_config (ignore list without mtp) and no MTP tensors."""
    art = Path(shutil.copytree(tiny_checkpoint, tmp_path / "art"))
    cfg = json.loads((art / "config.json").read_text())
    cfg["quantization_config"] = {
        "quant_method": "compressed-tensors",
        "ignore": ["re:.*visual.*"],
        "config_groups": {},
    }
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


def test_graft_json_says_what_it_did(quantized_like: Path, tiny_checkpoint: Path) -> None:
    """`--json`: the plan and whether it wrote, as one JSON document on stdout (then: nothing to do)."""
    proc = qq("graft-mtp", str(quantized_like), "--source", str(tiny_checkpoint), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {
        "artifact": str(quantized_like),
        "nothing_to_do": False,
        "written": True,
        "plan": "add 15, add re:^mtp.* to quantization_config.ignore",
        "root_digest": None,
    }
    again = qq("graft-mtp", str(quantized_like), "--source", str(tiny_checkpoint), "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["nothing_to_do"] is True


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


def _other_head(tiny_checkpoint: Path, tmp_path: Path, intermediate: int = 768) -> Path:
    """The tiny checkpoint with an MTP head of another model (MLP `intermediate` wide, zeros)."""
    from qwenquant.checkpoint.tensorfile import RawTensor, shard_refs, write_shard

    other = Path(shutil.copytree(tiny_checkpoint, tmp_path / "other"))
    refs = shard_refs(tiny_checkpoint / "model-mtp.safetensors")
    hidden = refs["mtp.norm.weight"].shape[0]
    tensors = []
    for name, r in sorted(refs.items()):
        shape = r.shape
        if ".mlp." in name:
            shape = (hidden, intermediate) if "down_proj" in name else (intermediate, hidden)
        tensors.append(RawTensor(name, r.dtype, tuple(shape), bytes(2 * math.prod(shape))) if shape != r.shape else r)
    (other / "model-mtp.safetensors").unlink()
    write_shard(other / "model-mtp.safetensors", tensors)
    return other


def test_graft_restores_a_deleted_mtp_shard_to_the_same_root(quantized_like: Path, tiny_checkpoint: Path) -> None:
    """The case the command exists for: model-mtp.safetensors deleted, the index still naming it."""
    from qwenquant.manifest import load_manifest, verify_artifact

    assert qq("graft-mtp", str(quantized_like), "--source", str(tiny_checkpoint)).returncode == 0
    write_source_manifest(quantized_like, tiny_checkpoint)
    root = load_manifest(quantized_like).root_digest
    (quantized_like / "model-mtp.safetensors").unlink()
    assert not verify_artifact(quantized_like).ok
    proc = qq("graft-mtp", str(quantized_like), "--source", str(tiny_checkpoint))
    assert proc.returncode == 0, proc.stderr
    assert "grafted: add 15" in proc.stdout
    assert verify_artifact(quantized_like).ok and load_manifest(quantized_like).root_digest == root
    assert mtp_bytes(quantized_like) == mtp_bytes(tiny_checkpoint)


def test_graft_refuses_a_source_the_manifest_does_not_record(
    quantized_like: Path, tiny_checkpoint: Path, tmp_path: Path
) -> None:
    """Another checkpoint of the same shapes (other seed) is not this artifact's source: exit 4,
    one line naming the file that differs, nothing written."""
    from qwenquant.testbed.tiny import build_tiny_checkpoint

    write_source_manifest(quantized_like, tiny_checkpoint)
    other = build_tiny_checkpoint(tmp_path / "seed1", variant="random", seed=1)
    before = {p.name: p.read_bytes() for p in quantized_like.iterdir()}
    proc = qq("graft-mtp", str(quantized_like), "--source", str(other))
    assert proc.returncode == 4, proc.stderr
    assert "model-mtp.safetensors differs from the file" in flat(proc.stderr)
    assert "unexpected error" not in proc.stderr
    assert {p.name: p.read_bytes() for p in quantized_like.iterdir()} == before


def test_graft_refuses_mtp_tensors_of_another_shape(
    quantized_like: Path, tiny_checkpoint: Path, tmp_path: Path
) -> None:
    """No manifest to prove the source by: the shapes config.json implies still refuse another
    model's head (MLP 768 wide instead of 512), exit 5, nothing written."""
    other = _other_head(tiny_checkpoint, tmp_path)
    before = {p.name: p.read_bytes() for p in quantized_like.iterdir()}
    proc = qq("graft-mtp", str(quantized_like), "--source", str(other))
    assert proc.returncode == 5, proc.stderr
    assert "mtp.layers.0.mlp.down_proj.weight has shape [256, 768], but" in flat(proc.stderr)
    assert "implies [256, 512]" in flat(proc.stderr)
    assert {p.name: p.read_bytes() for p in quantized_like.iterdir()} == before


def test_check_names_mtp_tensors_whose_shapes_disagree_with_the_config(
    quantized_like: Path, tiny_checkpoint: Path, tmp_path: Path
) -> None:
    """`qwenquant check` on an artifact whose MTP shard was swapped for another model's: exit 6 and
    one finding per tensor of the wrong shape, naming it and the shape config.json implies."""
    assert qq("graft-mtp", str(quantized_like), "--source", str(tiny_checkpoint)).returncode == 0

    def shape_findings() -> list[dict]:
        proc = qq("check", str(quantized_like), "--json")
        assert proc.returncode == 6, proc.stderr
        return [f for f in json.loads(proc.stdout)["findings"] if f["rule"] == "mtp" and "implies" in f["message"]]

    assert shape_findings() == []
    shutil.copy(_other_head(tiny_checkpoint, tmp_path) / "model-mtp.safetensors", quantized_like)
    found = {f["where"]: f["message"] for f in shape_findings()}
    assert sorted(found) == [f"mtp.layers.0.mlp.{p}_proj.weight" for p in ("down", "gate", "up")]
    assert found["mtp.layers.0.mlp.gate_proj.weight"].startswith("shape [768, 256], but config.json implies [512, 256]")


def _mount(args: list[str], where: Path) -> None:
    """Run mount(8); skip the test where mounting is not allowed (not root, or no mount namespace)."""
    import subprocess

    proc = subprocess.run(["mount", *args, str(where)], capture_output=True, text=True)
    if proc.returncode != 0:
        if os.environ.get("CI") == "true":  # CI runs as root: a mount that fails there is a failure
            pytest.fail(f"cannot mount under CI=true ({proc.stderr.strip()})")
        pytest.skip(f"cannot mount here ({proc.stderr.strip()}): the test needs root")


def _umount(where: Path) -> None:
    import subprocess

    subprocess.run(["umount", str(where)], capture_output=True, check=False)


def _listing(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() if p.is_file() else b"<dir>" for p in sorted(folder.rglob("*"))
    }


def _refused(proc, code: int, says: str) -> None:  # type: ignore[no-untyped-def]
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert proc.returncode == code, proc.stderr
    assert len(errors) == 1 and says in errors[0], proc.stderr
    assert "unexpected error" not in proc.stderr and "Traceback" not in proc.stderr


def test_graft_on_a_full_disk_exits_5_and_leaves_nothing_behind(
    quantized_like: Path, tiny_checkpoint: Path, tmp_path: Path
) -> None:
    """A tmpfs with room for the artifact but not for the MTP shard the graft writes: one line, exit 5
    (the disk is too small), the artifact's bytes as they were and no staging folder beside it."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    need = sum(-(-p.stat().st_size // 4096) * 4096 for p in quantized_like.iterdir()) + 4096 * len(
        list(quantized_like.iterdir())
    )
    _mount(["-t", "tmpfs", "-o", f"size={need + 256 * 1024}", "tmpfs"], mnt)
    try:
        art = Path(shutil.copytree(quantized_like, mnt / "art"))
        before = _listing(mnt)
        proc = qq("graft-mtp", str(art), "--source", str(tiny_checkpoint))
        _refused(proc, 5, f"graft-mtp could not write the grafted artifact beside {art} (No space left on device")
        assert "nothing was changed and nothing was left behind" in flat(proc.stderr)
        assert _listing(mnt) == before
    finally:
        _umount(mnt)


def test_graft_on_a_read_only_mount_exits_2_before_writing(
    quantized_like: Path, tiny_checkpoint: Path, tmp_path: Path
) -> None:
    """The artifact on a read-only tmpfs, then the artifact folder alone a read-only bind mount in a
    writable folder (where a staging copy of the whole artifact used to be left beside it): exit 2
    (an output path cannot be written), one line naming the folder, nothing written anywhere."""
    mnt = tmp_path / "ro"
    mnt.mkdir()
    _mount(["-t", "tmpfs", "-o", "size=64m", "tmpfs"], mnt)
    try:
        art = Path(shutil.copytree(quantized_like, mnt / "art"))
        _mount(["-o", "remount,ro"], mnt)
        before = _listing(mnt)
        proc = qq("graft-mtp", str(art), "--source", str(tiny_checkpoint))
        _refused(proc, 2, f"graft-mtp rebuilds {art} in {mnt}, but {mnt} cannot be written (Read-only file system)")
        assert _listing(mnt) == before
    finally:
        _umount(mnt)
    _mount(["--bind", str(quantized_like)], quantized_like)
    try:
        _mount(["-o", "remount,ro,bind"], quantized_like)
        before = _listing(quantized_like.parent)
        proc = qq("graft-mtp", str(quantized_like), "--source", str(tiny_checkpoint))
        _refused(proc, 2, f"but {quantized_like} cannot be written (Read-only file system)")
        assert _listing(quantized_like.parent) == before
    finally:
        _umount(quantized_like)
