"""The pure listing checks behind `qwenquant fetch` (paths, refused types, configs)."""

from __future__ import annotations

import pytest

from qwenquant.errors import FetchError
from qwenquant.fetch.selection import RemoteFile, check_listing, config_problems, lfs_pointer_blob_id, path_problem


@pytest.mark.parametrize(
    "path", ["/etc/passwd", "../up.json", "a/../../b", "a//b", "./config.json", "C:/x", "a\\b", "qwenquant-fetch.json",
             ".qwenquant-staging/x.part", ""],
)  # fmt: skip
def test_unsafe_paths(path: str) -> None:
    assert path_problem(path) is not None
    with pytest.raises(FetchError, match="refusing listed path"):
        check_listing([RemoteFile(path, 1, "0" * 40, None)])


@pytest.mark.parametrize("path", ["config.json", "sub/dir/model.safetensors", "tokenizer.json", ".gitattributes"])
def test_safe_paths(path: str) -> None:
    assert path_problem(path) is None


@pytest.mark.parametrize("path", ["x.py", "sub/m.PT", "w.bin", "w.pth", "w.pkl", "w.ckpt", "w.pickle", "c.pyc"])
def test_refused_types(path: str) -> None:
    with pytest.raises(FetchError, match=f"refusing {path}"):
        check_listing([RemoteFile(path, 1, "0" * 40, None)])


def test_lfs_oid_must_be_the_pointer_of_its_sha256() -> None:
    sha = "ab" * 32
    check_listing([RemoteFile("m.safetensors", 10, lfs_pointer_blob_id(sha, 10), sha)])
    with pytest.raises(FetchError, match="inconsistent"):
        check_listing([RemoteFile("m.safetensors", 10, "0" * 40, sha)])


def test_config_checks() -> None:
    ok = {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5"}
    assert config_problems("config.json", ok, model_config=True) == []
    text = {"architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text"}
    assert config_problems("config.json", text, model_config=True) == []
    assert "remote code" in config_problems("tokenizer_config.json", {"auto_map": {}}, model_config=False)[0]
    assert "not supported" in config_problems("config.json", {**ok, "architectures": []}, model_config=True)[0]
    assert "not qwen3_5" in config_problems("config.json", {**ok, "model_type": "llama"}, model_config=True)[0]
    assert config_problems("config.json", [1], model_config=True) == ["config.json is not a JSON object"]
