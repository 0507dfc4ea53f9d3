"""Content pinning across a history rewrite: when the recorded commit is gone (a squash) or the branch
moved, `qwenquant fetch` takes the branch's new commit only if every file's sha256 / git blob id equals
the record, and says which commit it used and why; one changed file and it refuses."""

from __future__ import annotations

import json
from pathlib import Path

from qwenquant.fetch import load_fetch_record

from helpers import run_cli
from support.hubserver import Fault

REPO = "Qwen/Qwen3.8-27B"
SHARD1 = "model-00001-of-00002.safetensors"


def fetch(capsys, out: Path, *extra: str, repo: str | None = REPO) -> tuple[int, str, str]:
    return run_cli(capsys, "fetch", *([repo] if repo else []), "--out", str(out), *extra)


def test_squashed_history_is_accepted_by_content(served, tmp_path: Path, capsys, disk) -> None:
    out = tmp_path / "out"
    assert fetch(capsys, out)[0] == 0
    served.hub.faults.add(Fault("squash"))  # before the next request: old commits vanish, same blobs
    served.hub.clear_log()
    code, stdout, err = fetch(capsys, out, "--json")
    assert code == 0, err
    new = served.hub.branch(REPO)
    assert new != served.commit
    assert f"commit {served.commit} is no longer on the server" in err and f"main now points at {new}" in err
    assert f"all equal the record by sha256 / git blob id: using {new}" in err
    assert json.loads(stdout)["commit"] == new and "using" in json.loads(stdout)["note"]
    record = load_fetch_record(out)
    assert record["commit"] == new and record["content_pinned"]["replaces_commit"] == served.commit
    assert served.hub.downloads() == []  # the same bytes: nothing fetched again
    disk.assert_identical_copy(out, served.source)


def test_squash_with_one_changed_file_is_refused(served, tmp_path: Path, capsys, disk) -> None:
    out = tmp_path / "out"
    assert fetch(capsys, out)[0] == 0
    before = (out / "qwenquant-fetch.json").read_bytes()
    served.hub.faults.add(Fault("squash", path=SHARD1))  # the same history rewrite, one shard's byte flipped
    served.hub.clear_log()
    code, _, err = fetch(capsys, out)
    assert code == 3
    assert f"commit {served.commit} is no longer on the server" in err
    assert f"{SHARD1} (changed); refusing it" in err and "--re-resolve" in err
    assert (out / "qwenquant-fetch.json").read_bytes() == before and served.hub.downloads() == []
    disk.assert_identical_copy(out, served.source)
    # taking the new content is a deliberate step: --re-resolve, verified and recorded anew
    code, _, err = fetch(capsys, out, "--re-resolve")
    assert code == 0, err
    assert load_fetch_record(out)["commit"] == served.hub.branch(REPO)
    assert [r.file for r in served.hub.downloads()] == [SHARD1]


def test_expect_pins_a_fresh_folder_to_a_records_content(served, tmp_path: Path, capsys, disk) -> None:
    first = tmp_path / "first"
    assert fetch(capsys, first)[0] == 0
    record = first / "qwenquant-fetch.json"
    served.hub.faults.add(Fault("squash"))
    code, out, err = fetch(capsys, tmp_path / "again", "--expect", str(record), repo=None)
    assert code == 0, err
    assert f"commit {served.commit} is no longer on the server" in err
    disk.assert_identical_copy(tmp_path / "again", served.source)
    served.hub.faults.add(Fault("squash", path="config.json"))
    code, _, err = fetch(capsys, tmp_path / "third", "--expect", str(record), repo=None)
    assert code == 3 and "config.json (changed); refusing it" in err
    assert not any((tmp_path / "third").glob("*.safetensors"))
    code, _, err = fetch(capsys, tmp_path / "x", "--expect", str(record), repo="someone/else")
    assert code == 2 and f"records {REPO}, not someone/else" in err


def test_expect_with_re_resolve_follows_a_moved_branch_only_to_the_same_content(served, tmp_path: Path, capsys) -> None:
    first = tmp_path / "first"
    assert fetch(capsys, first)[0] == 0
    record = first / "qwenquant-fetch.json"
    same = served.hub.add_commit(REPO, served.source, branch="main")  # a new commit id, the same files
    code, _, err = fetch(capsys, tmp_path / "same", "--expect", str(record), "--re-resolve")
    assert code == 0, err
    assert f"main moved from the expected commit {served.commit} to {same}" in err
    assert load_fetch_record(tmp_path / "same")["commit"] == same
    other = tmp_path / "other-src"
    other.mkdir()
    (other / "config.json").write_bytes((served.source / "config.json").read_bytes())
    served.hub.add_commit(REPO, other, branch="main")
    code, _, err = fetch(capsys, tmp_path / "moved", "--expect", str(record), "--re-resolve")
    assert code == 3 and f"{SHARD1} (missing)" in err and "refusing it" in err
