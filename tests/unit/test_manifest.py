"""Manifest and `qwenquant verify`: any change to any byte, file or the manifest is caught and named."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from qwenquant.atomic import canonical_json
from qwenquant.cli import main
from qwenquant.errors import VerificationError
from qwenquant.manifest import (
    MANIFEST_NAME,
    build_manifest,
    compute_root_digest,
    load_manifest,
    verify_artifact,
    write_manifest,
)

GOLDEN = Path(__file__).parent / "golden"
RECIPE = {"name": "fixture", "quantization": {"group_size": 128}}
FILES = {
    "config.json": b'{"architectures": ["Qwen3_5ForCausalLM"]}\n',
    "model-00001-of-00002.safetensors": bytes(range(256)) * 40,
    "model-00002-of-00002.safetensors": b"\x00" * 5000,
    "tokenizer/tokenizer.json": b'{"version": "1.0"}',
    "empty.txt": b"",
}


def _build(d: Path) -> Path:
    for rel, data in FILES.items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_bytes(data)
    m = build_manifest(
        d,
        source={"repo_id": "Qwen/Qwen3.8-27B", "revision": "0" * 40},
        recipe=RECIPE,
        recipe_sha256=hashlib.sha256(canonical_json(RECIPE)).hexdigest(),
        calibration={"source": "local", "num_samples": 2},
        stages={"quantize": {"status": "done"}},
        quality={"lm_head": {"nll_gptq": 1.0}},
        tool_versions={"qwenquant": "0.1.0"},
    )
    write_manifest(d, m)
    return d


@pytest.fixture
def art(tmp_path: Path) -> Path:
    return _build(tmp_path / "art")


def _verify(capsys: pytest.CaptureFixture[str], d: Path, *extra: str) -> tuple[int, str, str]:
    rc = main(["verify", str(d), *extra])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_manifest_golden_and_format(art: Path) -> None:
    data = (art / MANIFEST_NAME).read_bytes()
    golden = GOLDEN / "manifest-fixture.json"
    if os.environ.get("QWENQUANT_UPDATE_GOLDEN") == "1":
        golden.write_bytes(data)
    assert data == golden.read_bytes(), "refresh with QWENQUANT_UPDATE_GOLDEN=1 if the change is intended"
    d = json.loads(data)
    assert data == canonical_json(d)
    assert d["schema_version"] == 2
    assert [f["path"] for f in d["files"]] == sorted(FILES)
    lines = "".join(f"{p}\0{hashlib.sha256(FILES[p]).hexdigest()}\n" for p in sorted(FILES))
    lines += f"recipe\0{d['recipe_sha256']}\n"  # schema_version 2: the recipe (its serve profiles) is pinned too
    assert d["root_digest"] == hashlib.sha256(lines.encode()).hexdigest()
    m = load_manifest(art)
    assert m.root_digest == compute_root_digest(m.files, m.recipe_sha256) and m.to_dict() == d


def test_untouched_artifact_verifies(art: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _verify(capsys, art)
    assert rc == 0
    assert out.startswith("OK ") and load_manifest(art).root_digest in out
    rc, out, _ = _verify(capsys, art, "--json")
    assert rc == 0 and json.loads(out)["ok"] is True


@pytest.mark.parametrize("rel", sorted(FILES.keys() - {"empty.txt"}))
def test_flipped_byte_is_named(art: Path, rel: str, capsys: pytest.CaptureFixture[str]) -> None:
    p = art / rel
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0x01
    p.write_bytes(bytes(data))
    rc, out, err = _verify(capsys, art)
    assert rc == VerificationError.exit_code
    assert rel in out and "changed" in out and rel in err


def test_added_file_is_named(art: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (art / "tokenizer" / "stray.bin").write_bytes(b"x")
    rc, out, err = _verify(capsys, art)
    assert rc == 4 and "tokenizer/stray.bin (extra)" in err


def test_deleted_file_is_named(art: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, whole, _ = _verify(capsys, art, "--json")
    (art / "model-00002-of-00002.safetensors").unlink()
    rc, out, err = _verify(capsys, art, "--json")
    assert rc == 4
    report = json.loads(out)
    # the counts are of what was read: the missing file is not "checked"
    assert report["files_checked"] == json.loads(whole)["files_checked"] - 1
    assert report["bytes_checked"] == json.loads(whole)["bytes_checked"] - 5000
    assert report["problems"] == [
        {
            "path": "model-00002-of-00002.safetensors",
            "status": "missing",
            "detail": "listed in the manifest, not on disk",
            "expected_size": 5000,
            "actual_size": None,
        }
    ]


def _edit_manifest(art: Path, edit) -> None:
    d = json.loads((art / MANIFEST_NAME).read_bytes())
    edit(d)
    (art / MANIFEST_NAME).write_bytes(canonical_json(d))


def test_edited_file_hash_in_manifest(art: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _edit_manifest(art, lambda d: d["files"][0].update(sha256="0" * 64))
    rc, out, err = _verify(capsys, art)
    assert rc == 4 and MANIFEST_NAME in err and "root_digest" in out and d_first(art) in err


def d_first(art: Path) -> str:
    return json.loads((art / MANIFEST_NAME).read_bytes())["files"][0]["path"]


def test_edited_recipe_in_manifest(art: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _edit_manifest(art, lambda d: d["recipe"]["quantization"].update(group_size=64))
    rc, out, err = _verify(capsys, art)
    assert rc == 4 and f"{MANIFEST_NAME} (manifest)" in err and "manifest_self_digest" in out


def test_edited_manifest_with_recomputed_root_digest(art: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Rewriting a hash and the root digest still trips the self digest."""
    (art / "empty.txt").write_bytes(b"")  # unchanged bytes

    def edit(d: dict) -> None:
        d["stages"]["quantize"]["status"] = "forged"

    _edit_manifest(art, edit)
    rc, _, err = _verify(capsys, art)
    assert rc == 4 and MANIFEST_NAME in err


@pytest.mark.parametrize(
    "content, expect",
    [
        (b"{not json", "not valid JSON"),
        (b'{"schema_version": 2}', "root_digest is missing"),
        (
            b'{"schema_version": 1}',
            "is of schema_version 1 (an earlier qwenquant), whose root digest does not cover the recipe",
        ),
        (canonical_json([1, 2]), "not a JSON object"),
    ],
)
def test_malformed_manifest(art: Path, content: bytes, expect: str, capsys: pytest.CaptureFixture[str]) -> None:
    (art / MANIFEST_NAME).write_bytes(content)
    rc, _, err = _verify(capsys, art)
    assert rc == 4 and expect in err and "hint:" in err


def test_unsafe_path_in_manifest_is_refused(art: Path) -> None:
    _edit_manifest(art, lambda d: d["files"][0].update(path="../outside"))
    with pytest.raises(VerificationError, match="not a clean relative POSIX path"):
        load_manifest(art)


def test_missing_manifest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = _verify(capsys, tmp_path)
    assert rc == 4 and f"no {MANIFEST_NAME}" in err


def test_paths_sort_as_strings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "art"
    for rel in ("a/b", "a-b", "a.b", "A"):
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_bytes(rel.encode())
    write_manifest(
        d,
        build_manifest(
            d,
            source={},
            recipe={},
            recipe_sha256=hashlib.sha256(b"{}\n").hexdigest(),
            calibration={},
            stages={},
            quality={},
            tool_versions={},
        ),
    )
    assert [f.path for f in load_manifest(d).files] == ["A", "a-b", "a.b", "a/b"]
    assert _verify(capsys, d)[0] == 0


def test_report_api(art: Path) -> None:
    (art / "config.json").write_bytes(b"{}")
    r = verify_artifact(art)
    assert not r.ok and r.bad_files == ["config.json"]
    assert str(r.problems[0]).startswith("config.json: changed")
