"""What a published artifact's evidence is worth against the loopback hub: a card edited and re-sealed is
refused (it is re-derived from the manifest and the reports), a refused fetch leaves the verified copy
byte for byte as it was, a card record without its manifest is refused, `--root` pins the root digest,
conflicting reports are refused, and the card's sentences come from the manifest."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from qwenquant.hashing import seal
from qwenquant.manifest import load_manifest

from helpers import run_cli, write_eval_report, write_test_manifest

OUT = "me/tiny-w4a16"
SHARD = "model-00001-of-00002.safetensors"


def publish(capsys, art: Path, *extra: str) -> tuple[int, str, str]:
    return run_cli(capsys, "publish", str(art), "--repo", OUT, *extra)


def fetch(capsys, out: Path, *extra: str) -> tuple[int, str, str]:
    return run_cli(capsys, "fetch", OUT, "--out", str(out), *extra)


def folder_digests(folder: Path) -> dict[str, str]:
    """Every file under `folder` (qwenquant's own bookkeeping included) -> sha256."""
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def resealed_card(folder: Path, old: str, new: str) -> tuple[bytes, bytes]:
    """README.md with `old` replaced by `new`, and the card record updated to its sha256 and sealed
    again: what someone who edits the card and knows the record's format would publish."""
    readme = (folder / "README.md").read_text()
    assert old in readme, old
    data = readme.replace(old, new, 1).encode()
    rec = json.loads((folder / "qwenquant-card.json").read_text())
    rec["files"]["README.md"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    rec = seal({k: v for k, v in rec.items() if k != "card_self_digest"}, "card_self_digest")
    return data, (json.dumps(rec, indent=2, sort_keys=True) + "\n").encode()


def upload(hub, files: dict[str, bytes | None]) -> None:
    """One commit on the hub, as anyone with write access could make it (None: delete the file)."""
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi

    ops = [
        CommitOperationAdd(path_in_repo=p, path_or_fileobj=b) if b is not None else CommitOperationDelete(p)
        for p, b in files.items()
    ]
    HfApi(endpoint=hub.url).create_commit(OUT, operations=ops, commit_message="edit")


EDITS = {
    "a figure": ("| 96.00% |", "| 99.90% |"),
    "the root digest": ("    sha256:", "    sha256:0"),
    "a description": ("kept bf16 (vLLM's MTP drafter)", "GPTQ int4 (vLLM's MTP drafter)"),
}


@pytest.mark.parametrize("what", sorted(EDITS))
def test_a_card_edited_and_resealed_is_refused_by_verify_and_fetch(
    what: str, hub_w, artifact: Path, tmp_path: Path, capsys
) -> None:
    write_eval_report(artifact)
    assert publish(capsys, artifact, "--license", "apache-2.0")[0] == 0
    fetched = tmp_path / "fetched"
    assert fetch(capsys, fetched)[0] == 0
    old, new = EDITS[what]
    readme, record = resealed_card(fetched, old, new)
    line = readme.decode().splitlines().index(next(x for x in readme.decode().splitlines() if new in x)) + 1
    (fetched / "README.md").write_bytes(readme)
    (fetched / "qwenquant-card.json").write_bytes(record)
    code, _, err = run_cli(capsys, "verify", str(fetched))
    assert code == 4, err
    assert f"README.md (card: line {line} differs from what the manifest and reports give" in err
    assert "card and 1 reports unchanged" not in err and "re-fetch" in err
    # the same edit made on the hub: fetch refuses it, into a fresh folder and over the good copy
    upload(hub_w, {"README.md": readme, "qwenquant-card.json": record})
    before = folder_digests(tmp_path / "fetched-again") if (tmp_path / "fetched-again").exists() else {}
    code, _, err = fetch(capsys, tmp_path / "fetched-again")
    assert code == 4 and f"line {line} differs" in err and "never serve it" in err
    assert not (tmp_path / "fetched-again").exists() and before == {}


def test_a_refused_fetch_leaves_the_verified_copy_byte_for_byte(hub_w, artifact: Path, tmp_path: Path, capsys) -> None:
    """A squash that changed a shard, then the hint's --re-resolve into the folder holding the verified copy:
    refused by the manifest check with nothing in the folder changed, and --offline still agrees."""
    assert publish(capsys, artifact, "--license", "apache-2.0")[0] == 0
    fetched = tmp_path / "fetched"
    assert fetch(capsys, fetched)[0] == 0
    commit = json.loads((fetched / "qwenquant-fetch.json").read_text())["commit"]
    before = folder_digests(fetched)
    hub_w.squash(OUT, change=SHARD)
    code, _, err = fetch(capsys, fetched)
    assert code == 3 and f"{SHARD} (changed); refusing it" in err and "--re-resolve" in err
    assert folder_digests(fetched) == before
    code, _, err = fetch(capsys, fetched, "--re-resolve")
    assert code == 4 and f"{SHARD} (changed)" in err and "nothing in the folder was changed" in err
    assert folder_digests(fetched) == before
    code, out, err = run_cli(capsys, "fetch", "--offline", "--out", str(fetched))
    assert code == 0 and f"ok {OUT}@{commit}" in out, err
    assert run_cli(capsys, "verify", str(fetched))[0] == 0


@pytest.mark.parametrize("gone", ["qwenquant-manifest.json"])
def test_a_card_record_without_the_manifest_it_names_is_refused(
    gone: str, hub_w, artifact: Path, tmp_path: Path, capsys
) -> None:
    assert publish(capsys, artifact, "--license", "apache-2.0")[0] == 0
    upload(hub_w, {gone: None})
    code, _, err = fetch(capsys, tmp_path / "f")
    assert code == 4 and f"holds qwenquant-card.json, which names a {gone}, but the repo has no manifest" in err
    assert not (tmp_path / "f").exists()


def test_root_pins_the_announced_artifact(hub_w, artifact: Path, tmp_path: Path, capsys) -> None:
    root = load_manifest(artifact).root_digest
    assert publish(capsys, artifact, "--license", "apache-2.0")[0] == 0
    card = hub_w.file(OUT, "README.md").source.read_text()
    assert f"qwenquant fetch {OUT} --revision main --root sha256:{root} --out models/tiny-w4a16" in card
    code, out, err = fetch(capsys, tmp_path / "ok", "--root", f"sha256:{root}")
    assert code == 0 and f"root digest {root}" in out, err
    other = "ab" * 32
    code, _, err = fetch(capsys, tmp_path / "other", "--root", f"sha256:{other}")
    assert code == 4 and f"not the pinned sha256:{other}" in err and not (tmp_path / "other").exists()
    code, _, err = fetch(capsys, tmp_path / "bad", "--root", "sha256:12")
    assert code == 2 and "--root 'sha256:12' is not a sha256 root digest" in err


def test_root_pins_the_serve_profiles_too(hub_w, artifact: Path, tmp_path: Path, capsys) -> None:
    """A manifest re-sealed with another serve profile (host 0.0.0.0) and re-published: its root digest is
    another one, so the card's own `fetch --root` of the first publication refuses it (exit 4)."""
    from qwenquant.atomic import canonical_json
    from qwenquant.hashing import sha256_json
    from qwenquant.manifest import MANIFEST_NAME, build_manifest

    first = load_manifest(artifact)
    assert publish(capsys, artifact, "--license", "apache-2.0")[0] == 0
    recipe = json.loads(json.dumps(first.recipe))
    recipe["serve"]["profiles"]["single-user"]["host"] = "0.0.0.0"
    resealed = build_manifest(
        artifact,
        source=first.source,
        recipe=recipe,
        recipe_sha256=sha256_json(recipe),
        calibration=first.calibration,
        stages=first.stages,
        quality=first.quality,
        tool_versions=first.tool_versions,
        extra=first.extra,
    )
    assert resealed.root_digest != first.root_digest  # two builds that differ only in a serve profile
    (artifact / MANIFEST_NAME).write_bytes(canonical_json(resealed.to_dict()))
    assert publish(capsys, artifact, "--license", "apache-2.0")[0] == 0
    code, _, err = fetch(capsys, tmp_path / "pinned", "--root", f"sha256:{first.root_digest}")
    assert code == 4 and f"not the pinned sha256:{first.root_digest}" in err, err
    assert not (tmp_path / "pinned").exists()


def test_conflicting_reports_of_one_configuration_are_refused(hub_w, artifact: Path, tmp_path: Path, capsys) -> None:
    beside = write_eval_report(artifact, top1=0.949)  # found beside the artifact
    data = json.loads(beside.read_text())
    data["arms"]["artifact"]["top1"] = 0.999  # the same measurement, another figure
    other = tmp_path / "other.eval.json"
    other.write_text(json.dumps(data))
    code, _, err = publish(capsys, artifact, "--report", str(other), "--dry-run")
    assert code == 2, err
    assert "top-1 agreement with bf16" in err and "94.90%" in err and "99.90%" in err and str(other) in err
    assert hub_w.requests == []


def test_the_card_describes_what_the_manifest_says(hub_w, artifact: Path, capsys) -> None:
    """An int4-MTP recipe's card says so; the plain vLLM line fits the model's positions; a re-publish
    without --license keeps the license the repo's card has."""
    from qwenquant.recipe import load_recipe

    write_test_manifest(artifact, load_recipe("w4a16-int4head-int4mtp").canonical())
    positions = json.loads((artifact / "config.json").read_text())
    positions = (positions.get("text_config") or positions)["max_position_embeddings"]
    code, _, err = publish(capsys, artifact, "--license", "apache-2.0")
    assert code == 0, err
    card = hub_w.file(OUT, "README.md").source.read_text()
    mtp = next(x for x in card.splitlines() if x.startswith("- MTP head:"))
    assert "GPTQ int4" in mtp and "kept bf16" not in mtp
    vllm = next(x for x in card.splitlines() if x.startswith("vllm serve "))
    assert f"--max-model-len {positions} " in vllm + " "
    write_test_manifest(artifact, load_recipe("w4a16-int4head").canonical())  # another artifact, no --license
    code, _, err = publish(capsys, artifact)
    assert code == 0, err
    card = hub_w.file(OUT, "README.md").source.read_text()
    assert "license: apache-2.0" in card and "license: other" not in card


# -- signatures (pip install 'qwenquant[sign]') -------------------------------------------------------------


def test_the_signature_covers_the_card_and_a_resealed_card_is_refused(
    hub_w, artifact: Path, tmp_path: Path, capsys, keys
) -> None:
    from qwenquant.errors import VerificationError
    from qwenquant.signing import verify_signature

    priv, pub = keys
    write_eval_report(artifact)
    assert publish(capsys, artifact, "--license", "apache-2.0", "--sign-key", str(priv))[0] == 0
    code, out, _ = publish(capsys, artifact, "--license", "apache-2.0")  # without the key: the signature stays
    assert code == 0 and "already holds exactly this artifact" in out
    fetched = tmp_path / "fetched"
    assert fetch(capsys, fetched)[0] == 0
    sig = fetched / "model.sig"
    code, out, err = run_cli(capsys, "verify", str(fetched), "--signature", str(sig), "--public-key", str(pub))
    assert code == 0, err
    n = len(load_manifest(artifact).files)
    assert (
        f"over {n + 4} signed files: the manifest's {n} files, the manifest, the card, its record and 1 report" in out
    )
    readme, record = resealed_card(fetched, "| 96.00% |", "| 99.90% |")
    (fetched / "README.md").write_bytes(readme)
    (fetched / "qwenquant-card.json").write_bytes(record)
    with pytest.raises(VerificationError) as e:
        verify_signature(fetched, sig, pub)
    assert "Hash mismatch for" in str(e.value) and "README.md" in str(e.value)
    code, _, err = run_cli(capsys, "verify", str(fetched), "--signature", str(sig), "--public-key", str(pub))
    assert code == 4 and "README.md (card: line" in err


def test_signature_keys_and_a_missing_signature(hub_w, artifact: Path, tmp_path: Path, capsys, keys) -> None:
    """An RSA public key and a private key where the public key belongs: exit 2 naming what the file is;
    a required model.sig removed from the folder or the repo: exit 4 saying it is missing."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    from qwenquant.errors import VerificationError
    from qwenquant.signing import verify_signature

    priv, pub = keys
    assert publish(capsys, artifact, "--license", "apache-2.0", "--sign-key", str(priv))[0] == 0
    fetched = tmp_path / "fetched"
    assert fetch(capsys, fetched)[0] == 0
    sig = fetched / "model.sig"
    rsa_pub = tmp_path / "rsa.pub"
    rsa_pub.write_bytes(
        rsa.generate_private_key(public_exponent=65537, key_size=2048)
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    for argv in (
        ["verify", str(fetched), "--signature", str(sig), "--public-key"],
        ["serve", str(fetched), "--dry-run", "--require-signature"],
    ):
        code, _, err = run_cli(capsys, *argv, str(rsa_pub))
        assert code == 2 and f"{rsa_pub} is an RSA public key; model_signing's key method takes elliptic-curve" in err
        assert "unexpected error" not in err
        code, _, err = run_cli(capsys, *argv, str(priv))
        assert code == 2 and f"{priv} is a private key, not the public key" in err
    for not_a_signature in (rsa_pub, fetched / "config.json"):  # a PEM file, JSON that is no bundle: exit 2
        code, _, err = run_cli(
            capsys, "verify", str(fetched), "--signature", str(not_a_signature), "--public-key", str(pub)
        )
        assert code == 2 and f"error: {not_a_signature} is not a model_signing signature" in " ".join(err.split()), err
        assert "hint: pass the model.sig" in err
    sig.unlink()
    code, _, err = run_cli(capsys, "serve", str(fetched), "--dry-run", "--require-signature", str(pub))
    assert code == 4 and "model.sig: missing (named in qwenquant-card.json, not on disk" in err
    assert f"re-fetch the folder (`qwenquant fetch {OUT} --out {fetched}`" in err
    with pytest.raises(
        VerificationError, match="holds no signature model.sig: the signature that is required is missing"
    ):
        verify_signature(fetched, sig, pub)
    # removed on the hub: the card record names it, so fetch refuses the repo
    upload(hub_w, {"model.sig": None})
    code, _, err = fetch(capsys, tmp_path / "again")
    assert code == 4 and "model.sig (missing)" in err and not (tmp_path / "again").exists()


def test_serving_a_fetched_folder_with_an_edited_card_says_to_fetch_it_again(
    hub_w, artifact: Path, tmp_path: Path, capsys
) -> None:
    assert publish(capsys, artifact, "--license", "apache-2.0")[0] == 0
    fetched = tmp_path / "fetched"
    assert fetch(capsys, fetched)[0] == 0
    (fetched / "README.md").write_text((fetched / "README.md").read_text() + "\nbetter numbers\n")
    code, _, err = run_cli(capsys, "serve", str(fetched), "--dry-run")
    assert code == 4 and "README.md: card" in err
    assert (
        f"re-fetch them (`qwenquant fetch {OUT} --out {fetched}`)" in err
        and "re-run `qwenquant quantize` or" not in err
    )
    code, out, err = run_cli(capsys, "verify", str(fetched))  # verify names the repo as serve does, and counts right
    said = " ".join(err.split())
    assert code == 4 and f"re-fetch the folder (`qwenquant fetch {OUT} --out {fetched}`)" in said, said
    assert f"{fetched}: 1 problem\n" in out or f"{fetched}: 1 problem " in out, out
    assert fetch(capsys, fetched)[0] == 0  # which repairs it
    assert run_cli(capsys, "verify", str(fetched))[0] == 0


def test_ctrl_c_during_the_upload_stops_at_once_and_says_nothing_was_committed(
    hub_w, artifact: Path, tmp_path: Path
) -> None:
    """A real SIGINT to `qwenquant publish` while every LFS PUT is answered 503 (the client retries)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import qwenquant

    from support.hubserver import Fault

    hub_w.faults.add(Fault("upload_fail", path="lfs-put/*", status=503, times=None))
    env = {**os.environ, "PYTHONPATH": str(Path(qwenquant.__file__).resolve().parents[1])}  # the qwenquant under test
    proc = subprocess.Popen(
        [sys.executable, "-m", "qwenquant", "publish", str(artifact), "--repo", OUT, "--license", "mit"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not any(r.endpoint == "lfs-put" for r in hub_w.requests):
            assert time.monotonic() < deadline and proc.poll() is None, "the upload never started"
            time.sleep(0.05)
        head = hub_w.branch(OUT)
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert took < 3, f"{took:.1f} s from Ctrl-C to exit"
    assert (
        f"error: interrupted while uploading: nothing was committed: {OUT}@main is still at commit {head}"
        in err.replace("\n", " ")
    )
    assert hub_w.branch(OUT) == head


def test_bench_depth_soak_and_turns_reports_go_on_the_card_as_the_profiles_evidence(
    hub_w, artifact: Path, tmp_path: Path, capsys
) -> None:
    """The JSONs the README points to for checking a profile's promise (`bench --serve ARTIFACT --depth` etc.);
    one of a URL (no artifact named) is refused saying why."""
    root = load_manifest(artifact).root_digest
    target = {
        "label": "tiny",
        "url": "http://127.0.0.1:8000",
        "model": "tiny",
        "artifact_root_digest": root,
        "profile": "single-user",
        "device": "cpu",
        "vllm_version": "0.26.0",
    }
    runs = {
        "depth": {
            "tool": "qwenquant bench depth",
            "max_model_len": 4096,
            "concurrency": 1,
            "last_ok_depth": 4032,
            "failure": None,
            "rungs": [{"prompt_tokens": 2016, "ok": True}, {"prompt_tokens": 4032, "ok": True}],
        },
        "turns": {
            "tool": "qwenquant bench turns",
            "max_model_len": 4096,
            "last_ok_turn": 3,
            "last_ok_depth": 3900,
            "failure": None,
            "turns": [{"turn": 3, "depth": 3900, "ok": True}],
        },
        "soak": {
            "tool": "qwenquant bench soak",
            "max_model_len": 4096,
            "concurrency": 1,
            "soak_tokens": 2000,
            "verdict": {"status": "ok", "failures": [], "line": None},
            "windows": [],
        },
    }
    paths = []
    for name, body in runs.items():
        p = tmp_path / f"{name}.json"
        p.write_text(
            json.dumps({**body, "schema_version": 1, "argv": ["qwenquant", "bench", f"--{name}"], "target": target})
        )
        paths += ["--report", str(p)]
    code, _, err = publish(capsys, artifact, "--license", "apache-2.0", *paths)
    assert code == 0, err
    card = hub_w.file(OUT, "README.md").source.read_text()
    assert (
        "| profile promise (served) | single-user, max-model-len 4096: deepest prompt served (tokens) | 4032 |" in card
    )
    assert "conversation turns served | 3 |" in card and "verdict | ok |" in card
    assert {
        "qwenquant-reports/bench-depth.json",
        "qwenquant-reports/bench-soak.json",
        "qwenquant-reports/bench-turns.json",
    } <= set(hub_w.repo(OUT).commits[hub_w.branch(OUT)].files)
    assert fetch(capsys, tmp_path / "fetched")[0] == 0  # the card re-derives with them
    url = tmp_path / "url-depth.json"
    url.write_text(json.dumps({**runs["depth"], "target": {**target, "artifact_root_digest": None}}))
    code, _, err = publish(capsys, artifact, "--report", str(url), "--dry-run")
    assert code == 2 and "names no artifact root digest (a bench of a URL: nothing says which artifact" in err


@pytest.mark.slow
@pytest.mark.vllm
def test_a_fetched_folder_served_by_vllm_fetches_again(hub_w, tmp_path: Path, capsys) -> None:
    """`qwenquant serve` (the real vLLM CPU build) on the folder fetch wrote, then fetch and verify of it again."""
    from qwenquant.net.ports import free_port

    from helpers import LAUNCHER, ServedCLI, quantize_tiny_artifact, require_vllm, vllm_env

    require_vllm(LAUNCHER, "the vLLM environment (.venv-vllm)")
    art = quantize_tiny_artifact(tmp_path, "random", "text-only")
    assert publish(capsys, art, "--license", "apache-2.0")[0] == 0
    fetched = tmp_path / "fetched"
    assert fetch(capsys, fetched)[0] == 0
    before = folder_digests(fetched)
    env = dict(vllm_env(tmp_path), HF_ENDPOINT=hub_w.url)
    with ServedCLI(
        str(fetched),
        "--profile",
        "single-user",
        "--port",
        str(free_port()),
        "--vllm",
        str(LAUNCHER),
        "--timeout",
        "900",
        "--",
        "--max-model-len",
        "2048",
        env=env,
    ):
        pass
    after = folder_digests(fetched)
    assert after == before, (sorted(set(after) - set(before)), sorted(p for p in before if after.get(p) != before[p]))
    code, out, err = fetch(capsys, fetched)
    assert code == 0, err
    assert "kept" not in err, err
    code, out, err = run_cli(capsys, "fetch", "--offline", "--out", str(fetched))
    assert code == 0, err
    assert run_cli(capsys, "verify", str(fetched))[0] == 0


def test_a_card_record_of_another_format_is_refused(hub_w, artifact: Path, tmp_path: Path, capsys) -> None:
    """A card record without card_format (as qwenquant wrote them before cards were re-derived, or stripped
    of it to dodge the check): the card cannot be re-derived, so it is refused."""
    write_eval_report(artifact)
    assert publish(capsys, artifact, "--license", "apache-2.0")[0] == 0
    fetched = tmp_path / "fetched"
    assert fetch(capsys, fetched)[0] == 0
    rec = json.loads((fetched / "qwenquant-card.json").read_text())
    old = {k: v for k, v in rec.items() if k not in ("card_format", "license", "signature", "card_self_digest")}
    (fetched / "qwenquant-card.json").write_text(json.dumps(seal(old, "card_self_digest")))
    code, _, err = run_cli(capsys, "verify", str(fetched))
    assert code == 4 and "qwenquant-card.json (card: card format None, not 2: this qwenquant cannot re-derive" in err
