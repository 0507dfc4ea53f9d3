"""The loopback hub speaks what the real huggingface_hub client needs, and its fault switches bite."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from support.hubserver import Fault, HubServer

REPO = "Qwen/Qwen3.8-27B"
SHARD1 = "model-00001-of-00002.safetensors"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def git_blob(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@pytest.fixture
def client():
    with httpx.Client(timeout=10) as c:
        yield c


def resolve(hub: HubServer, path: str, rev: str = "main") -> str:
    return f"{hub.url}/{REPO}/resolve/{rev}/{path}"


def blob_get(client: httpx.Client, hub: HubServer, path: str, headers: dict | None = None) -> httpx.Response:
    r = client.get(resolve(hub, path))
    assert r.status_code == 302
    return client.get(r.headers["Location"], headers=headers or {})


def test_snapshot_download_with_the_real_client(served, tmp_path: Path, disk) -> None:
    from huggingface_hub import snapshot_download

    got = snapshot_download(REPO, endpoint=served.hub.url, local_dir=tmp_path / "snap")
    for rel, p in disk.final_files(served.source).items():
        assert (Path(got) / rel).read_bytes() == p.read_bytes()


def test_real_client_maps_hub_errors(served, tmp_path: Path) -> None:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError

    kw = {"endpoint": served.hub.url, "local_dir": tmp_path / "d"}
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download("nobody/nothing", "config.json", **kw)
    with pytest.raises(RevisionNotFoundError):
        hf_hub_download(REPO, "config.json", revision="no-such-branch", **kw)
    with pytest.raises(EntryNotFoundError):
        hf_hub_download(REPO, "missing.json", **kw)


def test_repo_info_and_tree_listing(served) -> None:
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile

    api = HfApi(endpoint=served.hub.url)
    info = api.model_info(REPO, revision="main", files_metadata=True)
    assert info.sha == served.commit and len(info.siblings) == 10
    files = {
        f.path: f for f in api.list_repo_tree(REPO, revision=served.commit, recursive=True) if isinstance(f, RepoFile)
    }
    for path, f in files.items():
        data = (served.source / path).read_bytes()
        assert f.size == len(data)
        if path.endswith(".safetensors") or path == "tokenizer.json":  # LFS by extension, like the Hub
            assert f.lfs.sha256 == sha256(data) and f.lfs.size == len(data)
            pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256(data)}\nsize {len(data)}\n"
            assert f.blob_id == git_blob(pointer.encode()) and f.lfs.pointer_size == len(pointer)
        else:
            assert f.lfs is None and f.blob_id == git_blob(data)


def test_tree_pagination_and_folders(hub, tmp_path: Path, client) -> None:
    (tmp_path / "src" / "sub").mkdir(parents=True)
    for i in range(5):
        (tmp_path / "src" / "sub" / f"f{i}.txt").write_text(str(i))
    (tmp_path / "src" / "top.json").write_text("{}")
    hub.add_repo(REPO, tmp_path / "src")
    hub.tree_page_size = 2
    r = client.get(f"{hub.url}/api/models/{REPO}/tree/main?recursive=true")
    assert len(r.json()) == 2 and 'rel="next"' in r.headers["Link"]
    from huggingface_hub import HfApi

    paths = [e.path for e in HfApi(endpoint=hub.url).list_repo_tree(REPO, recursive=True)]
    assert paths == ["sub", *[f"sub/f{i}.txt" for i in range(5)], "top.json"]
    top = client.get(f"{hub.url}/api/models/{REPO}/tree/main").json()
    assert [(e["type"], e["path"]) for e in top] == [("directory", "sub"), ("file", "top.json")]


def test_resolve_headers_lfs_redirect_and_small_file(served, client) -> None:
    f = served.hub.file(REPO, SHARD1)
    r = client.head(resolve(served.hub, SHARD1))
    assert r.status_code == 302 and r.headers["X-Repo-Commit"] == served.commit
    assert r.headers["X-Linked-Etag"] == f'"{f.sha256}"' and int(r.headers["X-Linked-Size"]) == f.size
    assert r.headers["Location"].startswith(f"http://localhost:{served.hub.port}/blobs/{f.sha256}")
    data = (served.source / "config.json").read_bytes()
    r = client.head(resolve(served.hub, "config.json"))
    assert r.status_code == 200 and r.headers["ETag"] == f'"{git_blob(data)}"'
    assert int(r.headers["Content-Length"]) == len(data) and r.headers["X-Repo-Commit"] == served.commit


def test_range_requests(served, client) -> None:
    data = (served.source / SHARD1).read_bytes()
    r = blob_get(client, served.hub, SHARD1, {"Range": "bytes=100-"})
    assert r.status_code == 206 and r.content == data[100:]
    assert r.headers["Content-Range"] == f"bytes 100-{len(data) - 1}/{len(data)}"
    r = blob_get(client, served.hub, SHARD1, {"Range": "bytes=10-19"})
    assert r.content == data[10:20]
    r = blob_get(client, served.hub, SHARD1, {"Range": f"bytes={len(data)}-"})
    assert r.status_code == 416 and r.headers["Content-Range"] == f"bytes */{len(data)}"
    r = client.get(resolve(served.hub, "config.json"), headers={"Range": "bytes=5-"})
    assert r.status_code == 206 and r.content == (served.source / "config.json").read_bytes()[5:]


def test_error_codes(served, client) -> None:
    cases = [
        (f"{served.hub.url}/nobody/x/resolve/main/config.json", "RepoNotFound"),
        (resolve(served.hub, "config.json", "nope"), "RevisionNotFound"),
        (resolve(served.hub, "nope.json"), "EntryNotFound"),
        (f"{served.hub.url}/api/models/{REPO}/revision/nope", "RevisionNotFound"),
        (f"{served.hub.url}/api/models/nobody/x/revision/main", "RepoNotFound"),
    ]
    for url, code in cases:
        r = client.get(url)
        assert (r.status_code, r.headers.get("X-Error-Code")) == (404, code), url


def test_commit_ids_are_content_derived_and_branches_move(hub, tiny_copy: Path, tmp_path: Path) -> None:
    with HubServer() as other:
        assert other.add_repo(REPO, tiny_copy) == hub.add_repo(REPO, tiny_copy)
    first = hub.branch(REPO)
    (tmp_path / "v2").mkdir()
    (tmp_path / "v2" / "config.json").write_text("{}")
    second = hub.add_commit(REPO, tmp_path / "v2")
    assert len(second) == 40 and second != first and hub.branch(REPO) == first
    hub.move_branch(REPO, "main", second, after_requests=2)
    with httpx.Client() as c:
        shas = [c.get(f"{hub.url}/api/models/{REPO}/revision/main").json()["sha"] for _ in range(3)]
    assert shas == [first, second, second]
    hub.move_branch(REPO, "main", first, drop_old=True)
    assert httpx.get(resolve(hub, "config.json", second)).headers["X-Error-Code"] == "RevisionNotFound"


def test_dataset_routes(hub, tmp_path: Path, client) -> None:
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "train.jsonl").write_text('{"text": "hi"}\n')
    commit = hub.add_repo("org/calib", tmp_path / "ds", repo_type="dataset")
    assert client.get(f"{hub.url}/api/datasets/org/calib/revision/main").json()["sha"] == commit
    assert client.get(f"{hub.url}/datasets/org/calib/resolve/{commit}/train.jsonl").text == '{"text": "hi"}\n'
    assert client.get(f"{hub.url}/api/models/org/calib/revision/main").headers["X-Error-Code"] == "RepoNotFound"
    from huggingface_hub import HfApi

    assert HfApi(endpoint=hub.url).dataset_info("org/calib").sha == commit


# -- fault switches, observed on the wire ---------------------------------------------------


def test_fault_fail_counts(served, client) -> None:
    served.hub.faults.add(Fault("fail", path="config.json", times=2, status=500))
    codes = [client.get(resolve(served.hub, "config.json")).status_code for _ in range(3)]
    assert codes == [500, 500, 200]


def test_fault_skip_then_always(served, client) -> None:
    served.hub.faults.add(Fault("fail", path="config.json", times=None, skip=1))
    codes = [client.get(resolve(served.hub, "config.json")).status_code for _ in range(3)]
    assert codes == [200, 503, 503]


def test_fault_truncate_and_close(served, client) -> None:
    served.hub.faults.add(Fault("truncate", path=SHARD1, at=1000))
    with pytest.raises(httpx.RemoteProtocolError):
        blob_get(client, served.hub, SHARD1)
    served.hub.faults.add(Fault("close", path=SHARD1, at=1000))
    with pytest.raises((httpx.ReadError, httpx.RemoteProtocolError)):
        blob_get(client, served.hub, SHARD1)
    assert [r.sent for r in served.hub.downloads(SHARD1)] == [1000, 1000]


def test_fault_corrupt_same_length(served, client) -> None:
    data = (served.source / SHARD1).read_bytes()
    served.hub.faults.add(Fault("corrupt", path=SHARD1, at=77))
    body = blob_get(client, served.hub, SHARD1).content
    assert len(body) == len(data) and body != data
    assert [i for i in range(len(data)) if body[i] != data[i]] == [77]


def test_plain_client_accepts_corrupt_bytes(served, tmp_path: Path) -> None:
    """Why qwenquant verifies: huggingface_hub checks the size only."""
    from huggingface_hub import hf_hub_download

    served.hub.faults.add(Fault("corrupt", path=SHARD1))
    p = hf_hub_download(REPO, SHARD1, endpoint=served.hub.url, local_dir=tmp_path / "d")
    assert Path(p).read_bytes() != (served.source / SHARD1).read_bytes()


def test_fault_ignore_range_and_bad_content_range(served, client) -> None:
    data = (served.source / SHARD1).read_bytes()
    served.hub.faults.add(Fault("ignore_range", path=SHARD1))
    r = blob_get(client, served.hub, SHARD1, {"Range": "bytes=100-"})
    assert r.status_code == 200 and r.content == data
    served.hub.faults.add(Fault("bad_content_range", path=SHARD1, shift=16))
    r = blob_get(client, served.hub, SHARD1, {"Range": "bytes=100-"})
    assert r.status_code == 206 and r.headers["Content-Range"].startswith("bytes 116-") and r.content == data[116:]


def test_fault_slow(served, client) -> None:
    served.hub.faults.add(Fault("slow", path="tokenizer.json", rate=200_000))
    t = time.monotonic()
    body = blob_get(client, served.hub, "tokenizer.json").content
    assert time.monotonic() - t >= 0.2 and body == (served.source / "tokenizer.json").read_bytes()


def test_fault_wrong_commit_and_not_found(served, client) -> None:
    served.hub.faults.add(Fault("wrong_commit", path="config.json", commit="a" * 40, method=None))
    assert client.head(resolve(served.hub, "config.json")).headers["X-Repo-Commit"] == "a" * 40
    served.hub.faults.add(Fault("not_found", path="config.json"))
    r = client.get(resolve(served.hub, "config.json"))
    assert (r.status_code, r.headers["X-Error-Code"]) == (404, "EntryNotFound")


def test_request_log_records_ranges(served, client) -> None:
    blob_get(client, served.hub, SHARD1, {"Range": "bytes=10-19"})
    (r,) = served.hub.downloads(SHARD1)
    # the server thread records `sent` after its sendfile returns, which can be after the client has
    # read the last byte: wait (bounded) for the bookkeeping instead of racing it
    deadline = time.monotonic() + 10
    while r.sent != 10 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert (r.range, r.status, r.start, r.end, r.sent) == ("bytes=10-19", 206, 10, 20, 10)


def test_module_entry_point_serves(tiny_copy: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    proc = subprocess.Popen([sys.executable, "-m", "qwenquant.testbed.hubserver", "--repo", f"{REPO}={tiny_copy}"],
                            stdout=subprocess.PIPE, text=True, env=env)  # fmt: skip
    try:
        lines = [proc.stdout.readline() for _ in range(2)]
        assert lines[0].startswith(f"model   {REPO} main -> ")
        url = lines[1].split()[-1]
        assert httpx.get(f"{url}/api/models/{REPO}/revision/main").json()["id"] == REPO
    finally:
        proc.terminate()
        proc.wait(10)


# -- uploads: what huggingface_hub sends with Xet off --------------------------------------------------------


@pytest.fixture
def writer(hub, monkeypatch: pytest.MonkeyPatch):
    """The real client with a (loopback) write token."""
    from huggingface_hub import HfApi

    monkeypatch.setenv("HF_TOKEN", "hf_loopback_write")
    return HfApi(endpoint=hub.url, token="hf_loopback_write")


def test_upload_folder_with_the_real_client_round_trips(hub, writer, tiny_copy: Path, tmp_path: Path, disk) -> None:
    from huggingface_hub import snapshot_download

    writer.create_repo("me/up")
    first = hub.branch("me/up")
    assert sorted(hub.repo("me/up").commits[first].files) == [".gitattributes"]  # as a new Hub repo starts
    info = writer.upload_folder(repo_id="me/up", folder_path=str(tiny_copy), commit_message="add")
    assert info.oid == hub.branch("me/up") != first
    assert hub.file("me/up", SHARD1).lfs and not hub.file("me/up", "config.json").lfs
    got = Path(snapshot_download("me/up", endpoint=hub.url, local_dir=tmp_path / "dl"))
    for rel, p in disk.final_files(tiny_copy).items():
        assert (got / rel).read_bytes() == p.read_bytes()
    kinds = [r.endpoint for r in hub.requests if r.method in ("POST", "PUT")]
    assert kinds[:1] == ["create"] and kinds[-1] == "commit"
    assert {"preupload", "lfs-batch", "lfs-put", "lfs-verify"} <= set(kinds)
    assert not [r for r in hub.requests if r.endpoint == "lfs-put" and r.authorized]  # the presigned PUT: no token


def test_writes_need_a_token(hub, tiny_copy: Path) -> None:
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    with pytest.raises(HfHubHTTPError) as e:
        HfApi(endpoint=hub.url, token=False).create_repo("me/up")
    assert e.value.response.status_code == 401 and hub.repo("me/up") is None


def test_an_object_whose_bytes_are_not_its_oid_is_not_stored_and_cannot_be_committed(hub, writer, client) -> None:
    writer.create_repo("me/up")
    head = hub.branch("me/up")
    auth = {"Authorization": "Bearer hf_loopback_write"}
    data = b"\0real bytes" * 10
    oid = sha256(data)
    batch = client.post(
        f"{hub.url}/me/up.git/info/lfs/objects/batch",
        headers=auth,
        json={"operation": "upload", "transfers": ["basic"], "objects": [{"oid": oid, "size": len(data)}]},
    )
    actions = batch.json()["objects"][0]["actions"]
    assert client.put(actions["upload"]["href"], content=b"\0fake bytes" * 10).status_code == 400
    assert client.post(actions["verify"]["href"], headers=auth, json={"oid": oid, "size": len(data)}).status_code == 404
    body = b"\n".join(
        json.dumps(x).encode()
        for x in (
            {"key": "header", "value": {"summary": "x"}},
            {"key": "lfsFile", "value": {"path": "w.safetensors", "algo": "sha256", "oid": oid, "size": len(data)}},
        )
    )
    assert client.post(f"{hub.url}/api/models/me/up/commit/main", headers=auth, content=body).status_code == 400
    assert hub.branch("me/up") == head  # a refused commit moves nothing
    assert client.put(actions["upload"]["href"], content=data).status_code == 200
    assert client.post(f"{hub.url}/api/models/me/up/commit/main", headers=auth, content=body).status_code == 200
    assert hub.file("me/up", "w.safetensors").sha256 == oid
    stale = body.replace(b'"summary": "x"', b'"summary": "y", "parentCommit": "%s"' % head.encode())
    assert client.post(f"{hub.url}/api/models/me/up/commit/main", headers=auth, content=stale).status_code == 412


def test_squash_fault_drops_old_commits_and_keeps_the_blobs(served, client) -> None:
    old = served.commit
    before = {p: f.blob_id for p, f in served.hub.repo(REPO).commits[old].files.items()}
    served.hub.faults.add(Fault("squash"))
    assert client.get(f"{served.hub.url}/api/models/{REPO}/revision/{old}").status_code == 404
    new = served.hub.branch(REPO)
    assert new != old and {p: f.blob_id for p, f in served.hub.repo(REPO).commits[new].files.items()} == before
    served.hub.faults.add(Fault("squash", path=SHARD1))
    assert client.get(f"{served.hub.url}/api/models/{REPO}").json()["sha"] == (newer := served.hub.branch(REPO)) != new
    after = {p: f.blob_id for p, f in served.hub.repo(REPO).commits[newer].files.items()}
    assert [p for p in before if after[p] != before[p]] == [SHARD1]
    assert list(served.hub.repo(REPO).commits) == [newer]


def _create_repo_on(module: str) -> httpx.Response:
    """Start `python -m MODULE` (an empty hub), ask it to create a repo, stop it; its answer."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "src"), str(root / "tests")])}
    proc = subprocess.Popen([sys.executable, "-m", module], stdout=subprocess.PIPE, text=True, env=env)
    try:
        url = proc.stdout.readline().split()[-1]
        return httpx.post(
            f"{url}/api/repos/create", json={"name": "x", "organization": "me"}, headers={"Authorization": "Bearer t"}
        )
    finally:
        proc.terminate()
        proc.wait(10)


def test_module_entry_point_serves_an_empty_hub_for_uploads() -> None:
    r = _create_repo_on("support.hubserver")
    assert r.status_code == 200 and r.json()["url"].endswith("/me/x")


def test_the_demo_hub_takes_no_uploads() -> None:
    """What ships (qwenquant.testbed.hubserver) serves downloads only: uploads are the tests' (tests/support)."""
    r = _create_repo_on("qwenquant.testbed.hubserver")
    assert r.status_code == 405 and r.json() == {"error": "this hub serves downloads only"}
