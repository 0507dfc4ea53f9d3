"""`qwenquant publish` with the real huggingface_hub client against the loopback hub: publish -> fetch ->
verify gives the same root digest, a re-run is a no-op, every upload fault leaves no half-published
revision and one clear error, and a re-run finishes the job; optional model_signing signatures."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from qwenquant.manifest import load_manifest

from helpers import (
    LAUNCHER,
    make_keys,
    quantize_tiny_artifact,
    require_vllm,
    run_cli,
    write_eval_report,
    write_test_manifest,
)
from support.hubserver import Fault

OUT = "me/tiny-w4a16"
SHARD = "model-00001-of-00002.safetensors"
WRITES = ("preupload", "lfs-batch", "lfs-put", "lfs-verify", "commit")


def publish(capsys, art: Path, *extra: str) -> tuple[int, str, str]:
    return run_cli(capsys, "publish", str(art), "--repo", OUT, "--license", "apache-2.0", *extra)


def listing(hub, revision: str = "main") -> dict[str, str]:
    """path -> sha256 of what the revision holds."""
    repo = hub.repo(OUT)
    return {p: f.sha256 for p, f in repo.commits[repo.branches[revision]].files.items()}


def writes(hub) -> list[str]:
    return [r.endpoint for r in hub.requests if r.endpoint in WRITES]


def assert_nothing_published(hub) -> None:
    """The branch still points at the repo's first commit (only the Hub's .gitattributes)."""
    repo = hub.repo(OUT)
    assert repo is None or sorted(listing(hub)) == [".gitattributes"]


def test_publish_fetch_verify_round_trip(hub_w, artifact: Path, tmp_path: Path, capsys) -> None:
    root = load_manifest(artifact).root_digest
    report = write_eval_report(artifact)
    code, out, err = publish(capsys, artifact)
    assert code == 0, err
    commit = hub_w.branch(OUT)
    assert f"commit {commit}" in out and f"url: {hub_w.url}/{OUT}/commit/{commit}" in out
    manifest = json.loads((artifact / "qwenquant-manifest.json").read_text())
    assert sorted(listing(hub_w)) == sorted(
        [f["path"] for f in manifest["files"]]
        + [
            "qwenquant-manifest.json",
            "README.md",
            "qwenquant-card.json",
            "qwenquant-reports/eval.json",
            ".gitattributes",
        ]
    )
    assert hub_w.file(OUT, SHARD).lfs
    assert hub_w.file(OUT, "qwenquant-reports/eval.json").sha256 == hashlib.sha256(report.read_bytes()).hexdigest()
    # fetch recognises the manifest and verifies it after the Hub hashes
    fetched = tmp_path / "fetched"
    code, out, err = run_cli(capsys, "fetch", OUT, "--out", str(fetched))
    assert code == 0, err
    assert (
        f"qwenquant artifact verified against its manifest: {len(manifest['files'])} files, root digest {root}" in out
    )
    assert "already verified, fetch record digest " in out and "verified, root " not in out  # two digests, two names
    code, out, err = run_cli(capsys, "verify", str(fetched))
    assert code == 0, err
    assert f"root sha256:{root}" in out and f"published as {OUT}: root digest {root}" in out
    assert f"fetched from {OUT}@{commit}" in out
    # the card does not weaken verify: one flipped weight byte fails it, naming the file
    data = bytearray((fetched / SHARD).read_bytes())
    data[len(data) // 2] ^= 0x01
    (fetched / SHARD).write_bytes(bytes(data))
    code, _, err = run_cli(capsys, "verify", str(fetched))
    assert code == 4 and f"{SHARD} (changed)" in err


@pytest.mark.parametrize(
    "path, data, words",
    [
        ("README.md", b"---\nlicense: mit\n---\n# better numbers\n", "README.md (card: sha256 differs"),
        (SHARD, None, f"{SHARD} (changed)"),
    ],
)
def test_a_file_replaced_on_the_hub_is_refused_by_fetch(
    hub_w, artifact: Path, tmp_path: Path, capsys, path: str, data: bytes | None, words: str
) -> None:
    """Someone with write access replaces a file: the Hub's hashes match the new bytes, the manifest does not."""
    from huggingface_hub import HfApi

    assert publish(capsys, artifact)[0] == 0
    if data is None:
        data = bytearray((artifact / path).read_bytes())
        data[-1] ^= 0x01
    HfApi(endpoint=hub_w.url).upload_file(path_or_fileobj=bytes(data), path_in_repo=path, repo_id=OUT)
    code, _, err = run_cli(capsys, "fetch", OUT, "--out", str(tmp_path / "f"))
    assert code == 4 and "matches the Hub's hashes but not its own qwenquant-manifest.json" in err
    assert words in err and "never serve it" in err


def test_rerun_is_a_noop_and_a_new_artifact_replaces_the_old_files(hub_w, artifact: Path, capsys) -> None:
    assert publish(capsys, artifact)[0] == 0
    first = hub_w.branch(OUT)
    hub_w.clear_log()
    code, out, err = publish(capsys, artifact)
    assert code == 0, err
    assert "already holds exactly this artifact" in out and f"commit {first}" in out
    assert writes(hub_w) == [] and hub_w.branch(OUT) == first
    # another artifact: one shard less (and a new manifest): the revision holds exactly its files
    (artifact / "model-mtp.safetensors").unlink()
    index = json.loads((artifact / "model.safetensors.index.json").read_text())
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if not k.startswith("mtp.")}
    (artifact / "model.safetensors.index.json").write_text(json.dumps(index))
    write_test_manifest(artifact)
    code, out, err = publish(capsys, artifact)
    assert code == 0, err
    assert "model-mtp.safetensors" not in listing(hub_w) and "1 deleted" in out
    assert writes(hub_w).count("lfs-put") == 0  # the shards that did not change are not sent again


def test_a_republish_without_license_keeps_the_repos_license_and_is_a_noop(
    hub_w, artifact: Path, tmp_path: Path, capsys
) -> None:
    """The source's README says `license: mit`, the first publish said --license apache-2.0: the same
    artifact published again without --license is a no-op (no commit) and the card keeps apache-2.0."""
    from qwenquant.hashing import sha256_json
    from qwenquant.manifest import build_manifest, write_manifest
    from qwenquant.recipe import load_recipe

    src = tmp_path / "source"
    src.mkdir()
    (src / "README.md").write_text("---\nlicense: mit\n---\n# the source\n")
    recipe = load_recipe("w4a16-int4head").canonical()
    write_manifest(
        artifact,
        build_manifest(
            artifact,
            source={},
            recipe=recipe,
            recipe_sha256=sha256_json(recipe),
            calibration={},
            stages={"source": {"params": {"path": str(src)}}},
            quality={},
            tool_versions={},
        ),
    )
    assert publish(capsys, artifact)[0] == 0
    first = hub_w.branch(OUT)
    hub_w.clear_log()
    code, out, err = run_cli(capsys, "publish", str(artifact), "--repo", OUT)
    assert code == 0, err
    assert "already holds exactly this artifact" in out and f"commit {first}" in out
    assert writes(hub_w) == [] and hub_w.branch(OUT) == first
    assert "license: apache-2.0" in hub_w.file(OUT, "README.md").source.read_text()


def test_dry_run_lists_files_and_card_without_network(hub_w, artifact: Path, capsys) -> None:
    code, out, err = publish(capsys, artifact, "--dry-run")
    assert code == 0, err
    assert hub_w.requests == []
    assert f"dry run: would publish {artifact} to {OUT}@main" in out
    assert f"  {SHARD}  " in out and "  README.md  " in out and "  qwenquant-card.json  " in out
    assert "  | ---" in out and "  | license: apache-2.0" in out


def test_refusals_before_any_upload(hub_w, artifact: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    data = bytearray((artifact / SHARD).read_bytes())
    data[100] ^= 0x01
    (artifact / SHARD).write_bytes(bytes(data))
    code, _, err = publish(capsys, artifact)
    assert code == 4 and f"refusing to publish {artifact}" in err and f"{SHARD} (changed)" in err
    data[100] ^= 0x01
    (artifact / SHARD).write_bytes(bytes(data))
    foreign = tmp_path / "other.eval.json"
    foreign.write_text(json.dumps({"arms": {}, "lm_head": {}, "root_digest": "e" * 64}))
    code, _, err = publish(capsys, artifact, "--report", str(foreign))
    assert code == 2 and f"{foreign} is a report of root digest eeeeeeeeeeeeeeee" in err
    assert run_cli(capsys, "publish", str(artifact), "--repo", "no-owner")[0] == 2
    assert hub_w.requests == []
    monkeypatch.delenv("HF_TOKEN")
    code, _, err = publish(capsys, artifact)
    assert code == 3 and "the Hub refused the token (HTTP 401)" in err and "HF_TOKEN" in err


def test_private_repo_needs_the_token_to_fetch(hub_w, artifact: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    assert publish(capsys, artifact, "--private")[0] == 0
    assert hub_w.repo(OUT).private
    assert run_cli(capsys, "fetch", OUT, "--out", str(tmp_path / "with"))[0] == 0
    monkeypatch.delenv("HF_TOKEN")
    code, _, err = run_cli(capsys, "fetch", OUT, "--out", str(tmp_path / "without"))
    assert code == 3 and "not found" in err


def test_branch_revision_is_created_from_main(hub_w, artifact: Path, capsys) -> None:
    code, out, err = publish(capsys, artifact, "--revision", "w4a16")
    assert code == 0, err
    assert "README.md" in listing(hub_w, "w4a16") and sorted(listing(hub_w, "main")) == [".gitattributes"]


def test_preupload_5xx_leaves_nothing_published(hub_w, artifact: Path, capsys) -> None:
    hub_w.faults.add(Fault("upload_fail", path="preupload", status=503, times=None))
    code, _, err = publish(capsys, artifact)
    assert code == 3 and f"{OUT}: uploading the files failed (HTTP 503)" in err and "nothing was committed" in err
    assert_nothing_published(hub_w)
    hub_w.faults.clear()
    assert publish(capsys, artifact)[0] == 0
    assert "README.md" in listing(hub_w)


def test_a_put_cut_once_is_retried_and_never_stored_half(hub_w, artifact: Path, capsys) -> None:
    sha = load_manifest(artifact).files[[f.path for f in load_manifest(artifact).files].index(SHARD)].sha256
    cut = hub_w.faults.add(Fault("upload_cut", path=f"lfs-put/{sha}", times=1))
    code, _, err = publish(capsys, artifact)
    assert code == 0, err
    assert cut.hits == 1 and hub_w.file(OUT, SHARD).sha256 == sha
    assert Path(hub_w.repo(OUT).lfs[sha]).read_bytes() == (artifact / SHARD).read_bytes()


def test_a_put_cut_every_time_fails_clearly_and_a_rerun_sends_only_that_object(hub_w, artifact: Path, capsys) -> None:
    sha = {f.path: f.sha256 for f in load_manifest(artifact).files}[SHARD]
    hub_w.faults.add(Fault("upload_cut", path=f"lfs-put/{sha}", times=None))
    code, _, err = publish(capsys, artifact)
    assert code == 3 and f"{OUT}: uploading {SHARD} failed" in err
    assert_nothing_published(hub_w)
    assert sha not in hub_w.repo(OUT).lfs  # a cut body is never kept
    hub_w.faults.clear()
    hub_w.clear_log()
    assert publish(capsys, artifact)[0] == 0
    assert [r.file for r in hub_w.requests if r.endpoint == "lfs-put"] == [sha]


def test_a_failing_commit_publishes_nothing_and_a_rerun_uploads_nothing_again(hub_w, artifact: Path, capsys) -> None:
    hub_w.faults.add(Fault("upload_fail", path="commit", status=500, times=1))
    code, _, err = publish(capsys, artifact)
    assert code == 3 and f"{OUT}: the commit failed (HTTP 500)" in err
    assert_nothing_published(hub_w)
    hub_w.clear_log()
    code, out, err = publish(capsys, artifact)
    assert code == 0, err
    assert "lfs-put" not in writes(hub_w) and writes(hub_w)[-1] == "commit"


@pytest.mark.slow
def test_a_published_quantized_artifact_checks_and_serves_from_the_fetched_folder(
    hub_w, tmp_path: Path, capsys
) -> None:
    """No quantize step on the downloader's side: the fetched folder passes check and serve's preflight."""
    require_vllm(LAUNCHER, "the vLLM environment (.venv-vllm)")
    art = quantize_tiny_artifact(tmp_path, "random", "text-only")
    assert publish(capsys, art)[0] == 0
    fetched = tmp_path / "fetched"
    assert run_cli(capsys, "fetch", OUT, "--out", str(fetched))[0] == 0
    code, out, err = run_cli(capsys, "check", str(fetched))
    assert code == 0, out + err
    code, out, err = run_cli(
        capsys, "serve", str(fetched), "--dry-run", "--device", "cpu", "--", "--max-model-len", "2048"
    )
    assert code == 0, err
    assert f"--model {fetched.resolve()}" in out and "--speculative-config" in out


# -- signing (pip install 'qwenquant[sign]') ---------------------------------------------------------------


def test_signing_round_trip_and_a_flipped_byte_refused(hub_w, artifact: Path, tmp_path: Path, capsys, keys) -> None:
    from qwenquant.errors import VerificationError
    from qwenquant.publish import verify_signature

    priv, pub = keys
    assert publish(capsys, artifact, "--sign-key", str(priv))[0] == 0
    assert "model.sig" in listing(hub_w)
    hub_w.clear_log()
    code, out, _ = publish(capsys, artifact, "--sign-key", str(priv))  # the signature there holds: a no-op
    assert code == 0 and "already holds exactly this artifact" in out and "lfs-put" not in writes(hub_w)
    fetched = tmp_path / "fetched"
    assert run_cli(capsys, "fetch", OUT, "--out", str(fetched))[0] == 0
    sig = fetched / "model.sig"
    code, out, err = run_cli(capsys, "verify", str(fetched), "--signature", str(sig), "--public-key", str(pub))
    assert code == 0, err
    assert f"signature {sig}: valid for {pub}" in out
    # the same folder passes that project's own verifier, as is
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "model_signing",
            "verify",
            "key",
            str(fetched),
            "--signature",
            str(sig),
            "--public_key",
            str(pub),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # another key's public half, and one flipped byte, are refused
    _, other_pub = make_keys(tmp_path / "other")
    code, _, err = run_cli(capsys, "verify", str(fetched), "--signature", str(sig), "--public-key", str(other_pub))
    assert code == 4 and "does not hold" in err
    # serve refuses the same folder for the other key, before anything starts (dry run: every check listed)
    code, _, err = run_cli(capsys, "serve", str(fetched), "--dry-run", "--require-signature", str(other_pub))
    assert code != 0 and "does not hold" in err
    code, _, err = run_cli(capsys, "serve", str(fetched), "--dry-run", "--require-signature", str(pub))
    assert "does not hold" not in err and "signature" not in err.lower(), err
    data = bytearray((fetched / SHARD).read_bytes())
    data[-1] ^= 0x01
    (fetched / SHARD).write_bytes(bytes(data))
    with pytest.raises(VerificationError, match=f"Hash mismatch for '{SHARD}'"):
        verify_signature(fetched, sig, pub)
    code, _, err = run_cli(capsys, "verify", str(fetched), "--signature", str(sig), "--public-key", str(pub))
    assert code == 4 and f"{SHARD} (changed)" in err
    assert run_cli(capsys, "verify", str(fetched), "--signature", str(sig))[0] == 2
