"""Pinned Hub eval text sets (evaluate/textset.py) against the loopback hub server with the real
huggingface_hub client: one declared file fetched and verified, cached and reused without the
network, a wrong declared sha256 refused, an unreachable hub named with a way out, and `qwenquant
eval --text-set` cutting its windows from the fetched text."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from qwenquant.errors import FetchError, UsageError
from qwenquant.evaluate import textset

from helpers import write_test_manifest

ROWS = [{"text": f"def f{i}(x):\n    return x + {i}\n"} for i in range(400)]


def _dataset(tmp_path: Path) -> Path:
    d = tmp_path / "ds"
    (d / "data").mkdir(parents=True)
    (d / "data" / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    (d / "data" / "train.jsonl").write_text("not fetched\n" * 1000)
    return d


def _declare(tmp_path: Path, commit: str, sha256: str | None, name: str = "loop") -> Path:
    decl = {
        "schema_version": 1,
        "name": name,
        "repo": "demo/evaltext",
        "repo_type": "dataset",
        "revision": commit,
        "file": "data/test.jsonl",
        "sha256": sha256,
        "text_field": "text",
        "join": "\n",
        "license": "CC0-1.0",
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(decl))
    return path


def test_fetched_verified_cached_and_reused_offline(hub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = _dataset(tmp_path)
    commit = hub.add_repo("demo/evaltext", data, repo_type="dataset")
    sha = hashlib.sha256((data / "data" / "test.jsonl").read_bytes()).hexdigest()
    ts = textset.load_text_set(_declare(tmp_path, commit, sha))
    path = textset.fetch_text_set(ts, tmp_path / "cache")
    assert path.read_bytes() == (data / "data" / "test.jsonl").read_bytes()
    assert not (path.parent / "train.jsonl").exists()  # only the declared file is fetched
    assert textset.read_text(path, ts) == "\n".join(r["text"] for r in ROWS)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing there: the cache must serve
    assert textset.fetch_text_set(ts, tmp_path / "cache") == path
    path.write_text("tampered")  # a cache that no longer verifies is fetched again (and fails offline)
    with pytest.raises(FetchError, match="could not be fetched"):
        textset.fetch_text_set(ts, tmp_path / "cache")


def test_declared_sha256_must_match(hub, tmp_path: Path) -> None:
    commit = hub.add_repo("demo/evaltext", _dataset(tmp_path), repo_type="dataset")
    ts = textset.load_text_set(_declare(tmp_path, commit, "0" * 64))
    with pytest.raises(FetchError, match="is not the declared 0000"):
        textset.fetch_text_set(ts, tmp_path / "cache")


def test_unreachable_hub_names_the_set_and_the_way_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("QWENQUANT_FETCH_BACKOFF", "0.01")
    ts = textset.load_text_set(_declare(tmp_path, "a" * 40, None))
    with pytest.raises(FetchError) as e:
        textset.fetch_text_set(ts, tmp_path / "cache")
    assert "eval text set loop (demo/evaltext@aaaaaaaaaaaa, data/test.jsonl) could not be fetched" in e.value.message
    assert "--text FILE" in e.value.hint


def test_declarations_are_checked(tmp_path: Path) -> None:
    shipped = textset.load_text_set(textset.DEFAULT_TEXT_SET)
    assert len(shipped.revision) == 40 and shipped.license and shipped.file.endswith(".parquet")
    bad = _declare(tmp_path, "main", "xyz")
    with pytest.raises(UsageError, match="revision: must be a full 40-hex commit.*sha256: must be 64 hex"):
        textset.load_text_set(bad)
    with pytest.raises(UsageError, match="no eval text set 'nope'"):
        textset.load_text_set("nope")


def test_eval_cuts_windows_from_a_fetched_text_set(hub, tmp_path: Path) -> None:
    from qwenquant.testbed.tiny import reference_model

    commit = hub.add_repo("demo/evaltext", _dataset(tmp_path), repo_type="dataset")
    decl = _declare(tmp_path, commit, None)
    source = reference_model.build_reference_checkpoint(tmp_path / "source")
    art = tmp_path / "self"
    shutil.copytree(source, art)
    write_test_manifest(art, {"name": "none"})
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "xdg"), QWENQUANT_THREADS="2")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "qwenquant",
            "eval",
            "offline",
            str(art),
            "--reference",
            str(source),
            "--reference-unverified",
            "--text-set",
            str(decl),
            "--windows",
            "4",
            "--window-len",
            "64",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert (out["text_set"], out["revision"], out["file"]) == ("loop", commit, "data/test.jsonl")
    assert out["arms"]["artifact"]["windows"] == 4 and out["arms"]["artifact"]["kl"] == pytest.approx(0, abs=1e-7)
    cached = tmp_path / "xdg" / "qwenquant" / "evaltext" / f"demo--evaltext@{commit}" / "data" / "test.jsonl"
    assert cached.is_file()
