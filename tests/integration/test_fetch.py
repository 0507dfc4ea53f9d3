"""`qwenquant fetch` against the loopback hub: the real client, real HTTP, faults on the wire."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qwenquant.fetch import load_fetch_record, verify_fetch_record

from helpers import run_cli as run
from support.hubserver import Fault

REPO = "Qwen/Qwen3.8-27B"

SHARD1 = "model-00001-of-00002.safetensors"
SHARD2 = "model-00002-of-00002.safetensors"


def fetch(capsys, out: Path, *extra: str) -> tuple[int, str, str]:
    return run(capsys, "fetch", REPO, "--out", str(out), *extra)


def test_fetch_gives_byte_identical_copy_and_record(served, tmp_path: Path, capsys, disk) -> None:
    out = tmp_path / "out"
    code, stdout, err = fetch(capsys, out, "--json")
    assert code == 0, err
    disk.assert_identical_copy(out, served.source)
    summary = json.loads(stdout)
    assert summary["commit"] == served.commit and summary["downloaded"] == 10
    assert served.commit in err  # the resolved commit is printed once
    record = load_fetch_record(out)
    assert record["repo_id"] == REPO and record["commit"] == served.commit
    assert record["endpoint"] == served.hub.url
    for f in record["files"]:
        src = served.source / f["path"]
        assert f["size"] == src.stat().st_size and f["sha256"] == disk.sha256(src)
        assert f["git_blob_id"] == served.hub.file(REPO, f["path"]).blob_id
    assert verify_fetch_record(out)["root_digest"] == record["root_digest"]
    assert not (out / ".qwenquant-staging").exists()


def test_fetch_by_commit_and_every_file_once(served, tmp_path: Path, capsys, disk) -> None:
    code, _, err = fetch(capsys, tmp_path / "out", "--revision", served.commit)
    assert code == 0, err
    disk.assert_identical_copy(tmp_path / "out", served.source)
    got = sorted(r.file for r in served.hub.downloads())
    assert got == sorted(disk.final_files(served.source))  # each file's bytes asked for exactly once
    assert all(r.revision == served.commit for r in served.hub.requests if r.endpoint == "resolve")


def test_paginated_tree_listing(served, tmp_path: Path, capsys, disk) -> None:
    served.hub.tree_page_size = 3
    assert fetch(capsys, tmp_path / "out")[0] == 0
    assert len([r for r in served.hub.requests if r.endpoint == "tree"]) >= 4
    disk.assert_identical_copy(tmp_path / "out", served.source)


TRANSIENT = {
    "fail_503_twice": [Fault("fail", path=SHARD1, times=2, status=503)],
    "fail_500_once": [Fault("fail", path="config.json", times=1, status=500)],
    "close_mid_body_once": [Fault("close", path=SHARD1, times=1)],
    "truncate_once": [Fault("truncate", path=SHARD1, times=1, at=1_000_000)],
    "corrupt_once": [Fault("corrupt", path=SHARD1, times=1)],
    "corrupt_small_file_once": [Fault("corrupt", path="tokenizer_config.json", times=1, at=10)],
    "ignore_range_on_resume": [Fault("truncate", path=SHARD2, at=500_000), Fault("ignore_range", path=SHARD2)],
    "wrong_content_range_on_resume": [
        Fault("truncate", path=SHARD2, at=500_000),
        Fault("bad_content_range", path=SHARD2, shift=4096),
    ],  # fmt: skip
    "api_503_twice": [Fault("fail", path="/api", times=2, method=None)],
    "slow_stream": [Fault("slow", path="model-mtp.safetensors", rate=20_000_000)],
}


@pytest.mark.parametrize("name", sorted(TRANSIENT))
def test_transient_faults_end_in_verified_copy(name: str, served, tmp_path: Path, capsys, disk) -> None:
    faults = [served.hub.faults.add(f) for f in TRANSIENT[name]]
    code, _, err = fetch(capsys, tmp_path / "out")
    assert code == 0, err
    assert all(f.hits >= 1 for f in faults), [(f.kind, f.hits) for f in faults]
    disk.assert_identical_copy(tmp_path / "out", served.source)


def test_truncated_body_resumes_with_range(served, tmp_path: Path, capsys) -> None:
    served.hub.faults.add(Fault("truncate", path=SHARD1, at=1_000_000))
    assert fetch(capsys, tmp_path / "out")[0] == 0
    blobs = served.hub.downloads(SHARD1)
    assert [r.range for r in blobs] == [None, "bytes=1000000-"]
    assert blobs[1].status == 206 and blobs[1].sent == (served.source / SHARD1).stat().st_size - 1_000_000


PERMANENT = {
    "wrong_bytes_always": (Fault("corrupt", path=SHARD1, times=None), SHARD1, "failed 5 times"),
    "entry_404": (Fault("not_found", path=SHARD2, times=None), SHARD2, "file not found at the pinned commit"),
    "fail_503_always": (Fault("fail", path=SHARD2, times=None), SHARD2, "HTTP 503"),
    "wrong_commit_header": (Fault("wrong_commit", path=SHARD1, commit="e" * 40), SHARD1, "e" * 40),
}


@pytest.mark.parametrize("name", sorted(PERMANENT))
def test_permanent_faults_fail_naming_the_file(name: str, served, tmp_path: Path, capsys, disk) -> None:
    fault, path, words = PERMANENT[name]
    served.hub.faults.add(fault)
    code, _, err = fetch(capsys, tmp_path / "out")
    assert code == 3
    assert f"error: {path}" in err and words in err
    disk.assert_only_verified(tmp_path / "out", served.source)
    assert not (tmp_path / "out" / "qwenquant-fetch.json").exists()


def test_branch_moved_mid_run_keeps_the_pinned_commit(served, tmp_path: Path, capsys, disk) -> None:
    """A branch that moves while we download does not mix commits: we stay on the pinned one."""
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_bytes((served.source / "config.json").read_bytes())
    new = served.hub.add_commit(REPO, other)
    served.hub.move_branch(REPO, "main", new, after_requests=4)
    code, _, err = fetch(capsys, tmp_path / "out")
    assert code == 0, err
    assert served.hub.branch(REPO) == new
    assert load_fetch_record(tmp_path / "out")["commit"] == served.commit
    disk.assert_identical_copy(tmp_path / "out", served.source)


def test_branch_force_pushed_mid_run_fails(served, tmp_path: Path, capsys, disk) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_bytes((served.source / "config.json").read_bytes())
    new = served.hub.add_commit(REPO, other)
    served.hub.move_branch(REPO, "main", new, after_requests=8, drop_old=True)
    code, _, err = fetch(capsys, tmp_path / "out", "--workers", "1")
    assert code == 3
    assert "commit not found on the server" in err and "--re-resolve" in err
    disk.assert_only_verified(tmp_path / "out", served.source)
    # re-running reuses the pending commit (gone), --re-resolve takes the new one
    assert fetch(capsys, tmp_path / "out")[0] == 3
    code, _, err = fetch(capsys, tmp_path / "out", "--re-resolve")
    assert code == 0, err
    assert load_fetch_record(tmp_path / "out")["commit"] == new
    assert sorted(disk.final_files(tmp_path / "out")) == ["config.json"]


def _refuse(served, tmp_path: Path, capsys, path: str, words: str, disk) -> str:
    served.hub.add_commit(REPO, served.source, branch="main")
    code, _, err = fetch(capsys, tmp_path / "out")
    assert code == 3, err
    assert path in err and words in err
    disk.assert_only_verified(tmp_path / "out", served.source)
    assert not served.hub.downloads("*.safetensors")  # refused before the weights were fetched
    return err


@pytest.mark.parametrize("name", ["modeling_qwen.py", "pytorch_model.bin", "extra/weights.pt", "opt.pkl"])
def test_refused_file_types(name: str, served, tmp_path: Path, capsys, disk) -> None:
    (served.source / name).parent.mkdir(exist_ok=True)
    (served.source / name).write_bytes(b"import os\n")
    _refuse(served, tmp_path, capsys, name, "never fetched", disk)


def test_remote_code_config_refused(served, tmp_path: Path, capsys, disk) -> None:
    cfg = json.loads((served.source / "config.json").read_text())
    cfg["auto_map"] = {"AutoModel": "modeling_x.Model"}
    (served.source / "config.json").write_text(json.dumps(cfg))
    _refuse(served, tmp_path, capsys, "config.json", "remote code", disk)


def test_unsupported_architecture_refused(served, tmp_path: Path, capsys, disk) -> None:
    cfg = json.loads((served.source / "config.json").read_text())
    cfg["architectures"], cfg["model_type"] = ["LlamaForCausalLM"], "llama"
    (served.source / "config.json").write_text(json.dumps(cfg))
    err = _refuse(served, tmp_path, capsys, "config.json", "LlamaForCausalLM", disk)
    assert "not supported" in err
    assert not (tmp_path / "out" / "config.json").exists()


def test_bad_safetensors_header_refused(served, tmp_path: Path, capsys, disk) -> None:
    p = served.source / "model-mtp.safetensors"
    data = bytearray(p.read_bytes())
    n = int.from_bytes(data[:8], "little")
    header = data[8 : 8 + n].replace(b'"BF16"', b'"Q4X"', 1).replace(b'"F32"', b'"Q4X"', 1)
    data[8 : 8 + n] = header[:n].ljust(n)
    p.write_bytes(bytes(data))
    served.hub.add_commit(REPO, served.source, branch="main")
    code, _, err = fetch(capsys, tmp_path / "out")
    assert code == 3 and "model-mtp.safetensors" in err and "Q4X" in err
    assert not (tmp_path / "out" / "model-mtp.safetensors").exists()
    disk.assert_only_verified(tmp_path / "out", served.source)


def test_index_naming_missing_tensor_refused(served, tmp_path: Path, capsys, disk) -> None:
    idx = json.loads((served.source / "model.safetensors.index.json").read_text())
    idx["weight_map"]["mtp.ghost.weight"] = "model-mtp.safetensors"
    (served.source / "model.safetensors.index.json").write_text(json.dumps(idx))
    served.hub.add_commit(REPO, served.source, branch="main")
    code, _, err = fetch(capsys, tmp_path / "out")
    assert code == 3
    assert "model.safetensors.index.json" in err and "mtp.ghost.weight" in err
    assert not (tmp_path / "out" / "qwenquant-fetch.json").exists()
    disk.assert_only_verified(tmp_path / "out", served.source)


def test_unknown_repo_and_revision(hub, tmp_path: Path, capsys) -> None:
    code, _, err = fetch(capsys, tmp_path / "out")
    assert code == 3 and "not found" in err and REPO in err


def test_disk_space_checked_first(served, tmp_path: Path, capsys, monkeypatch) -> None:
    import shutil

    from qwenquant.fetch import snapshot

    monkeypatch.setattr(snapshot.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**9, 10**9 - 1000, 1000))
    code, _, err = fetch(capsys, tmp_path / "out")
    assert code == 3 and "GiB still to download but only 0.00 GiB free" in err
    assert not served.hub.downloads()


def test_token_goes_to_the_hub_never_to_the_cdn(served, tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_secret_test_token")
    assert fetch(capsys, tmp_path / "out")[0] == 0
    hub_side = [r for r in served.hub.requests if r.endpoint in ("info", "tree", "resolve")]
    cdn_side = [r for r in served.hub.requests if r.endpoint == "blob"]
    assert hub_side and all(r.authorized for r in hub_side)
    assert cdn_side and not any(r.authorized for r in cdn_side)
    assert {r.host for r in cdn_side} == {"localhost"}


def test_dataset_repo(hub, tmp_path: Path, capsys, disk) -> None:
    src = tmp_path / "calib"
    src.mkdir()
    (src / "train.jsonl").write_text('{"text": "def add(a, b): return a + b"}\n' * 50)
    (src / "data").mkdir()
    (src / "data" / "part-0.parquet").write_bytes(b"PAR1" + bytes(5000) + b"PAR1")
    commit = hub.add_repo("org/calib", src, repo_type="dataset")
    code, stdout, err = run(capsys, "fetch", "org/calib", "--repo-type", "dataset", "--out", str(tmp_path / "out"))
    assert code == 0, err
    disk.assert_identical_copy(tmp_path / "out", src)
    assert load_fetch_record(tmp_path / "out")["commit"] == commit
    resolves = [r.path for r in hub.requests if r.endpoint == "resolve"]
    assert len(resolves) == 2 and all(p.startswith(f"/datasets/org/calib/resolve/{commit}/") for p in resolves)


def test_symlinked_destination_refused(served, tmp_path: Path, capsys, disk) -> None:
    out = tmp_path / "out"
    assert fetch(capsys, out)[0] == 0
    (tmp_path / "elsewhere").write_text("not yours")
    (out / "config.json").unlink()
    (out / "config.json").symlink_to(tmp_path / "elsewhere")
    code, _, err = fetch(capsys, out)
    assert code == 3 and "config.json is a symlink" in err
    assert (tmp_path / "elsewhere").read_text() == "not yours"


def test_help_imports_no_heavy_modules() -> None:
    import subprocess
    import sys

    code = ("import sys; from qwenquant.cli import main; main(['fetch', '--help']); "
            "heavy = [m for m in ('torch', 'transformers', 'huggingface_hub', 'httpx') if m in sys.modules]; "
            "sys.exit(1 if heavy else 0)")  # fmt: skip
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "Examples:" in r.stdout and r.stdout.rstrip().endswith("--json")


def test_files_with_identical_content(served, tmp_path: Path, capsys, disk) -> None:
    """Two paths with the same sha256 download side by side without sharing a partial."""
    (served.source / "copies").mkdir()
    for i in range(3):
        (served.source / "copies" / f"dup{i}.safetensors").write_bytes((served.source / SHARD1).read_bytes())
    served.hub.add_commit(REPO, served.source, branch="main")
    served.hub.faults.add(Fault("slow", path="copies/*", rate=20_000_000, times=None))
    code, _, err = fetch(capsys, tmp_path / "out")
    assert code == 0, err
    disk.assert_identical_copy(tmp_path / "out", served.source)


def test_one_fetch_per_out_folder(served, tmp_path: Path, capsys, disk) -> None:
    import fcntl
    import os

    staging = tmp_path / "out" / ".qwenquant-staging"
    staging.mkdir(parents=True)
    fd = os.open(staging / "lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        code, _, err = fetch(capsys, tmp_path / "out")
        assert code == 2 and "another qwenquant fetch is writing into" in err  # as quantize's work folder lock
    finally:
        os.close(fd)
    assert fetch(capsys, tmp_path / "out")[0] == 0


def test_out_is_a_file(served, tmp_path: Path, capsys) -> None:
    """A file where a folder is asked: a usage error (exit 2), the file kept."""
    (tmp_path / "out").write_text("I am a file")
    code, _, err = fetch(capsys, tmp_path / "out")
    assert code == 2 and f"--out {tmp_path / 'out'} is a file, not a folder" in err and "Traceback" not in err
    assert (tmp_path / "out").read_text() == "I am a file"


def test_unreachable_endpoint(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("QWENQUANT_FETCH_BACKOFF", "0.01")
    code, _, err = fetch(capsys, tmp_path / "out")
    assert code == 3 and "http://127.0.0.1:9" in err and "HF_ENDPOINT" in err


def test_a_fetched_folder_served_by_the_loopback_hub_fetches(served, tmp_path: Path, capsys, disk) -> None:
    """`hubserver --repo NAME=FOLDER` on a folder fetch wrote serves the repo it holds, not the fetch's own
    record and staging area (a repo listing qwenquant-fetch.json is refused by fetch)."""
    out = tmp_path / "out"
    assert fetch(capsys, out)[0] == 0
    (out / ".qwenquant-staging").mkdir()
    (out / ".qwenquant-staging" / "pending.json").write_text("{}")  # an interrupted fetch's leftovers
    served.hub.add_repo("me/mirror", out)
    assert sorted(served.hub.repo("me/mirror").commits[served.hub.branch("me/mirror")].files) == sorted(
        disk.final_files(served.source)
    )
    again = tmp_path / "again"
    code, _, err = run(capsys, "fetch", "me/mirror", "--out", str(again))
    assert code == 0, err
    disk.assert_identical_copy(again, served.source)
    assert run(capsys, "fetch", "me/mirror", "--out", str(again))[0] == 0
    assert run(capsys, "fetch", "--offline", "--out", str(again))[0] == 0
