"""What one publish commit holds against the revision's listing, and the fetch's content pin (pure)."""

from __future__ import annotations

import hashlib

from qwenquant.fetch.pinning import content_diff
from qwenquant.fetch.selection import RemoteFile as Listed
from qwenquant.fetch.selection import lfs_pointer_blob_id
from qwenquant.publish.plan import LocalFile, RemoteFile, plan_upload
from qwenquant.publish.run import git_blob


def local(path: str, data: bytes) -> LocalFile:
    return LocalFile(path, len(data), hashlib.sha256(data).hexdigest(), data=data)


def on_hub(f: LocalFile, *, lfs: bool) -> RemoteFile:
    blob = lfs_pointer_blob_id(f.sha256, f.size) if lfs else git_blob(f)
    return RemoteFile(f.path, f.size, blob, f.sha256 if lfs else None)


FILES = [
    local("model-00001-of-00001.safetensors", b"\0weights" * 100),
    local("config.json", b'{"a": 1}'),
    local("qwenquant-manifest.json", b"{}"),
    local("README.md", b"# card\n"),
]
LFS = {"model-00001-of-00001.safetensors"}


def hub_of(files: list[LocalFile], **extra: RemoteFile) -> dict[str, RemoteFile]:
    remote = {f.path: on_hub(f, lfs=f.path in LFS) for f in files}
    remote[".gitattributes"] = RemoteFile(".gitattributes", 10, "0" * 40, None)
    return remote | extra


def test_new_repo_uploads_everything_and_keeps_the_hubs_gitattributes() -> None:
    plan = plan_upload(FILES, hub_of([]), git_blob)
    assert [f.path for f in plan.upload] == [f.path for f in FILES] and plan.delete == [] and not plan.noop


def test_same_content_is_a_noop_by_sha256_and_git_blob_id() -> None:
    plan = plan_upload(FILES, hub_of(FILES), git_blob)
    assert plan.noop and plan.unchanged == sorted(f.path for f in FILES)


def test_a_changed_file_is_sent_and_a_stale_one_deleted_in_the_same_commit() -> None:
    stale = RemoteFile("model-00002-of-00002.safetensors", 5, "1" * 40, "2" * 64)
    changed = [local("config.json", b'{"a": 2}') if f.path == "config.json" else f for f in FILES]
    plan = plan_upload(changed, hub_of(FILES, **{stale.path: stale}), git_blob)
    assert [f.path for f in plan.upload] == ["config.json"]
    assert plan.delete == [stale.path]  # the revision ends with exactly this artifact's files


def test_lfs_content_is_compared_by_sha256_not_by_size() -> None:
    big = FILES[0]
    same_size = LocalFile(big.path, big.size, "9" * 64, data=b"x" * big.size)
    plan = plan_upload([same_size, *FILES[1:]], hub_of(FILES), git_blob)
    assert [f.path for f in plan.upload] == [big.path]


def test_signature_kept_while_the_signed_files_are_unchanged() -> None:
    sig = RemoteFile("model.sig", 100, "3" * 40, None)
    remote = hub_of(FILES, **{"model.sig": sig})
    plan = plan_upload(FILES, remote, git_blob)  # no --sign-key, nothing changed: the signature holds
    assert plan.kept_signature and plan.noop
    card_only = [local("README.md", b"# new card\n") if f.path == "README.md" else f for f in FILES]
    plan = plan_upload(card_only, remote, git_blob)  # the card is signed too: a new card, another signature needed
    assert not plan.kept_signature and plan.delete == ["model.sig"] and [f.path for f in plan.upload] == ["README.md"]
    weights = [local(FILES[0].path, b"other weights")] + FILES[1:]
    plan = plan_upload(weights, remote, git_blob)  # the signed files changed: that signature signs other bytes
    assert not plan.kept_signature and plan.delete == ["model.sig"]


def test_a_new_signature_replaces_one_that_does_not_hold_for_this_key() -> None:
    remote = hub_of(FILES, **{"model.sig": RemoteFile("model.sig", 100, "3" * 40, None)})
    new = local("model.sig", b"signature")
    plan = plan_upload(FILES, remote, git_blob, signature=new, remote_signature_ok=lambda: False)
    assert [f.path for f in plan.upload] == ["model.sig"] and plan.delete == []
    plan = plan_upload(FILES, remote, git_blob, signature=new, remote_signature_ok=lambda: True)
    assert plan.noop and plan.kept_signature


def record_of(files: list[Listed]) -> list[dict]:
    return [
        {
            "path": f.path,
            "size": f.size,
            "sha256": f.sha256 or hashlib.sha256(f.path.encode()).hexdigest(),
            "git_blob_id": f.blob_id,
            "lfs": f.lfs,
        }
        for f in files
    ]


def test_content_pin_compares_sha256_of_lfs_files_and_blob_ids_of_small_ones() -> None:
    shard = Listed("model.safetensors", 8, lfs_pointer_blob_id("a" * 64, 8), "a" * 64)
    config = Listed("config.json", 4, "b" * 40, None)
    rec = record_of([shard, config])
    assert content_diff(rec, [shard, config]) == []
    changed = Listed("model.safetensors", 8, lfs_pointer_blob_id("c" * 64, 8), "c" * 64)
    assert content_diff(rec, [changed, config]) == ["model.safetensors (changed)"]
    assert content_diff(rec, [shard, Listed("config.json", 4, "d" * 40, None)]) == ["config.json (changed)"]
    assert content_diff(rec, [shard]) == ["config.json (missing)"]
    assert content_diff(rec, [shard, config, Listed("extra.json", 1, "e" * 40, None)]) == ["extra.json (added)"]
