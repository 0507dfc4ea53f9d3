"""Commands that write a folder never destroy what they did not write, and a broken local source
fails at the source stage with one line naming the file (real CLI in a subprocess)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NOTES = b"my own notes\nnot written by qwenquant\n"
SHARD1 = "model-00001-of-00002.safetensors"


def qq(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, QWENQUANT_NO_PROGRESS="1")
    env.pop("QWENQUANT_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "qwenquant", *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO
    )


def users_folder(path: Path) -> str:
    """A folder holding a user's notes.txt; returns the sha256 of the notes."""
    path.mkdir(parents=True)
    (path / "notes.txt").write_bytes(NOTES)
    return hashlib.sha256(NOTES).hexdigest()


def assert_untouched(path: Path, digest: str) -> None:
    assert sorted(p.name for p in path.iterdir()) == ["notes.txt"]
    assert hashlib.sha256((path / "notes.txt").read_bytes()).hexdigest() == digest


def one_error(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, stderr[-3000:]
    assert "Traceback" not in stderr
    return lines[0]


def quantize(source: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return qq("quantize", str(source), "--calibration", "tiny-demo", "--source-unverified", "--out", str(out), *extra)


# --- quantize --out / --work ---------------------------------------------------------------------


def test_quantize_refuses_an_out_folder_holding_user_files(tiny_checkpoint: Path, tmp_path: Path) -> None:
    digest = users_folder(tmp_path / "out")
    proc = quantize(tiny_checkpoint, tmp_path / "out")
    assert proc.returncode == 5, proc.stderr[-3000:]
    line = one_error(proc.stderr)
    assert f"--out {tmp_path / 'out'} exists and is not an artifact of recipe 'w4a16-int4head'" in line
    assert "notes.txt" in line and "--force" in proc.stderr
    assert_untouched(tmp_path / "out", digest)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no work folder, no staging folder


def test_quantize_refuses_an_artifact_of_another_recipe(tiny_checkpoint: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    manifest = {"files": [], "recipe": {"name": "some-other-recipe"}, "source": {"files": {}}}
    (out / "qwenquant-manifest.json").write_text(json.dumps(manifest))
    before = (out / "qwenquant-manifest.json").read_bytes()
    proc = quantize(tiny_checkpoint, out)
    assert proc.returncode == 5 and "qwenquant-manifest.json" in one_error(proc.stderr)
    assert (out / "qwenquant-manifest.json").read_bytes() == before


def test_quantize_refuses_a_work_folder_holding_user_files(tiny_checkpoint: Path, tmp_path: Path) -> None:
    digest = users_folder(tmp_path / "mywork")
    proc = quantize(tiny_checkpoint, tmp_path / "out", "--work", str(tmp_path / "mywork"))
    assert proc.returncode == 5
    assert f"--work {tmp_path / 'mywork'} exists and is not a quantize work folder" in one_error(proc.stderr)
    assert_untouched(tmp_path / "mywork", digest)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("force", [(), ("--force",)])
def test_quantize_refuses_an_out_that_is_a_file(tiny_checkpoint: Path, tmp_path: Path, force: tuple) -> None:
    """A file where a folder is asked is a usage error (exit 2), kept with --force too."""
    (tmp_path / "out").write_bytes(NOTES)
    proc = quantize(tiny_checkpoint, tmp_path / "out", *force)
    assert proc.returncode == 2 and f"--out {tmp_path / 'out'} is a file, not a folder" in one_error(proc.stderr)
    assert (tmp_path / "out").read_bytes() == NOTES


def test_quantize_force_with_a_refused_source_removes_nothing(tiny_checkpoint: Path, tmp_path: Path) -> None:
    """`quantize SOURCE --out DIR --force` with a source the source stage refuses (no fetch record, and
    no --source-unverified: exit 4): DIR keeps every byte, and nothing is said removed."""
    digest = users_folder(tmp_path / "out")
    proc = qq("quantize", str(tiny_checkpoint), "--calibration", "tiny-demo", "--out", str(tmp_path / "out"), "--force")
    assert proc.returncode == 4, proc.stderr[-3000:]
    one_error(proc.stderr)
    assert "--force: removing" not in proc.stderr
    assert_untouched(tmp_path / "out", digest)


# --- fetch --out ----------------------------------------------------------------------------------


def test_fetch_refuses_then_force_replaces_a_users_folder(served, tmp_path: Path, disk) -> None:
    digest = users_folder(tmp_path / "out")
    proc = qq("fetch", served.repo_id, "--out", str(tmp_path / "out"))
    assert proc.returncode == 5, proc.stderr[-3000:]
    assert "holds no fetch of model repo Qwen/Qwen3.8-27B" in one_error(proc.stderr)
    assert_untouched(tmp_path / "out", digest)
    assert not served.hub.downloads()

    proc = qq("fetch", served.repo_id, "--out", str(tmp_path / "out"), "--force")
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = proc.stderr.index("--force: removing")
    assert "notes.txt" in proc.stderr[said:].splitlines()[0]
    assert not (tmp_path / "out" / "notes.txt").exists()
    disk.assert_identical_copy(tmp_path / "out", served.source)


def test_fetch_force_removes_nothing_when_the_repo_does_not_resolve(served, tmp_path: Path) -> None:
    """`fetch typo/repo --out DIR --force`: the repo is not found (exit 3) and DIR keeps every byte."""
    digest = users_folder(tmp_path / "out")
    proc = qq("fetch", "typo/repo", "--out", str(tmp_path / "out"), "--force")
    assert proc.returncode == 3, proc.stderr[-3000:]
    one_error(proc.stderr)
    assert "--force: removing" not in proc.stderr
    assert_untouched(tmp_path / "out", digest)


@pytest.mark.parametrize(
    "argv", [["fetch", "Qwen/Qwen3.8-27B", "--force", "--out"], ["demo", "--no-serve", "--force", "--work"]]
)
def test_a_file_where_a_folder_is_asked_is_exit_2_and_kept_with_force(served, tmp_path: Path, argv: list) -> None:
    (tmp_path / "f").write_bytes(NOTES)
    proc = qq(*argv, str(tmp_path / "f"), timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"{argv[-1]} {tmp_path / 'f'} is a file, not a folder" in one_error(proc.stderr)
    assert (tmp_path / "f").read_bytes() == NOTES and not served.hub.downloads()


def test_fetch_refuses_a_folder_holding_another_repo(served, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert qq("fetch", served.repo_id, "--out", str(out)).returncode == 0
    record = (out / "qwenquant-fetch.json").read_bytes()
    proc = qq("fetch", "someone/else", "--out", str(out))
    assert proc.returncode == 5 and "holds no fetch of model repo someone/else" in one_error(proc.stderr)
    assert (out / "qwenquant-fetch.json").read_bytes() == record
    # the same repo again is a resume: allowed
    assert qq("fetch", served.repo_id, "--out", str(out)).returncode == 0


# --- graft-mtp, demo --work -----------------------------------------------------------------------


def test_graft_mtp_refuses_then_force_removes_entries_it_would_drop(tiny_checkpoint: Path, tmp_path: Path) -> None:
    art = Path(shutil.copytree(tiny_checkpoint, tmp_path / "art"))
    index = json.loads((art / "model.safetensors.index.json").read_text())
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if not k.startswith("mtp.")}
    (art / "model.safetensors.index.json").write_text(json.dumps(index))
    (art / "model-mtp.safetensors").unlink()
    (art / "my-notes").mkdir()
    (art / "my-notes" / "notes.txt").write_bytes(NOTES)
    proc = qq("graft-mtp", str(art), "--source", str(tiny_checkpoint))
    assert proc.returncode == 5
    assert "my-notes" in one_error(proc.stderr) and "not part of the artifact" in proc.stderr
    assert (art / "my-notes" / "notes.txt").read_bytes() == NOTES
    assert not (art / "model-mtp.safetensors").exists()

    proc = qq("graft-mtp", str(art), "--source", str(tiny_checkpoint), "--force")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"--force: removing 1 file(s), {len(NOTES)} bytes: my-notes" in " ".join(proc.stderr.split())
    assert not (art / "my-notes").exists() and (art / "model-mtp.safetensors").is_file()


def test_demo_refuses_a_work_folder_holding_user_files(tmp_path: Path) -> None:
    digest = users_folder(tmp_path / "w")
    proc = qq("demo", "--work", str(tmp_path / "w"), "--no-serve")
    assert proc.returncode == 5
    assert "holds more than the demo's hub, models and artifacts folders" in one_error(proc.stderr)
    assert_untouched(tmp_path / "w", digest)


# --- a broken local source fails at the source stage ----------------------------------------------


def _only_config(src: Path, dst: Path) -> None:
    shutil.copy(src / "config.json", dst / "config.json")


def _no_weights(src: Path, dst: Path) -> None:
    for p in src.glob("*.json"):
        shutil.copy(p, dst / p.name)
    (dst / "model.safetensors.index.json").unlink()


def _truncated(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, dirs_exist_ok=True)
    data = (src / SHARD1).read_bytes()
    (dst / SHARD1).write_bytes(data[: len(data) // 2])


def _shard_missing(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, dirs_exist_ok=True)
    (dst / SHARD1).unlink()


def _no_tokenizer(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, dirs_exist_ok=True)
    (dst / "tokenizer.json").unlink()


def _bad_arch(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, dirs_exist_ok=True)
    cfg = json.loads((src / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**cfg, "architectures": ["LlamaForCausalLM"], "model_type": "llama"}))


@pytest.mark.parametrize(
    "make, names",
    [
        (_only_config, "holds no *.safetensors weights"),
        (_no_weights, "holds no *.safetensors weights"),
        (_truncated, f"{SHARD1}: bad safetensors header: tensors cover"),
        (_shard_missing, f"index names file {SHARD1} which does not exist"),
        (_no_tokenizer, "has no tokenizer (tokenizer.json"),
        (_bad_arch, "architectures ['LlamaForCausalLM']"),
    ],
    ids=[
        "only-config",
        "config-and-tokenizer-no-weights",
        "shard-truncated-to-half",
        "shard-missing",
        "no-tokenizer",
        "unsupported-architecture",
    ],
)
def test_broken_local_source_fails_at_the_source_stage(make, names: str, tiny_checkpoint: Path, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    make(tiny_checkpoint, src)
    proc = quantize(src, tmp_path / "out")
    assert proc.returncode == 5, proc.stderr[-3000:]
    assert names in one_error(proc.stderr)
    assert "hint:" in proc.stderr and "stage source: complete" not in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]  # no .work folder, no artifact
