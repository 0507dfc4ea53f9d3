"""Every command on broken inputs: one `error:` line and a hint, the documented exit code, and no
traceback unless QWENQUANT_DEBUG=1 (real CLI in a subprocess; the Hub is the loopback server)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import write_test_manifest

REPO = Path(__file__).resolve().parents[2]
SHARD1 = "model-00001-of-00002.safetensors"
NEVER = "0123456789abcdef0123456789abcdef01234567"
REAL_CONFIG = REPO / "src" / "qwenquant" / "data" / "qwen3_8-27b.config.json"


def qq(*args: str, debug: bool = False) -> subprocess.CompletedProcess:
    env = dict(os.environ, QWENQUANT_NO_PROGRESS="1", QWENQUANT_FETCH_BACKOFF="0.01")
    env.pop("QWENQUANT_DEBUG", None)
    if debug:
        env["QWENQUANT_DEBUG"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "qwenquant", *args], capture_output=True, text=True, timeout=300, env=env, cwd=REPO
    )


@pytest.fixture
def broken(tiny_checkpoint: Path, tmp_path: Path) -> dict[str, Path]:
    """Folders and files a user might point a command at by mistake."""
    b = {"missing": tmp_path / "missing", "file": tmp_path / "notes.txt", "empty": tmp_path / "empty"}
    b["file"].write_text("not a folder\n")
    b["empty"].mkdir()
    for name in ("only-config", "config-list", "truncated", "bad-manifest", "bad-config-json"):
        (tmp_path / name).mkdir()
        b[name] = tmp_path / name
    shutil.copy(tiny_checkpoint / "config.json", b["only-config"])
    (b["config-list"] / "config.json").write_text("[1, 2]")
    shutil.copytree(tiny_checkpoint, b["truncated"], dirs_exist_ok=True)
    data = (tiny_checkpoint / SHARD1).read_bytes()
    (b["truncated"] / SHARD1).write_bytes(data[: len(data) // 2])
    shutil.copytree(tiny_checkpoint, b["bad-manifest"], dirs_exist_ok=True)
    (b["bad-manifest"] / "qwenquant-manifest.json").write_text('{"files": 3}')
    (b["bad-config-json"] / "config.json").write_text("{not json")
    b["bad-yaml"] = tmp_path / "bad.yaml"
    b["bad-yaml"].write_text("x: [\n")
    b["wrong-recipe"] = tmp_path / "wrong.yaml"
    b["wrong-recipe"].write_text("name: x\nschema_version: 1\n")
    b["manifested"] = tmp_path / "manifested"  # a manifest that loads: commands get past reading it
    shutil.copytree(tiny_checkpoint, b["manifested"])
    write_test_manifest(b["manifested"])
    b["out"] = tmp_path / "out"
    return b


def cases(b: dict[str, Path], repo_id: str) -> list[tuple[list[str], int]]:
    """(argv, documented exit code) for every command."""
    s = {k: str(v) for k, v in b.items()}
    q = ["--calibration", "tiny-demo", "--source-unverified", "--out", s["out"]]
    return [
        (["fetch", "--out", s["out"]], 2),  # no repo id
        (["fetch", "not a repo id!", "--out", s["out"]], 2),
        (["fetch", repo_id, "--repo-type", "space", "--out", s["out"]], 2),
        (["fetch", "nobody/nothing", "--out", s["out"]], 3),  # not on the Hub
        (["fetch", repo_id, "--revision", NEVER, "--out", s["out"]], 3),  # a commit that never existed
        (["fetch", repo_id, "--out", s["file"]], 2),  # --out is a file: usage, kept
        (["fetch", "--offline", "--out", s["empty"]], 4),
        (["quantize", s["missing"], *q], 2),
        (["quantize", s["file"], *q], 2),
        (["quantize", s["only-config"], *q], 5),
        (["quantize", s["config-list"], *q], 5),
        (["quantize", s["bad-config-json"], *q], 5),
        (["quantize", s["truncated"], *q], 5),
        (["quantize", s["truncated"], "--recipe", "no-such-recipe", "--out", s["out"]], 2),
        (["quantize", s["truncated"], "--recipe", s["bad-yaml"], "--out", s["out"]], 2),
        (["quantize", s["truncated"], "--calibration", s["bad-yaml"], "--out", s["out"]], 2),
        (["quantize", s["truncated"], "--device", "tpu", "--out", s["out"]], 2),
        (["verify", s["missing"]], 2),
        (["verify", s["file"]], 2),
        (["verify", s["empty"]], 4),
        (["verify", s["bad-manifest"]], 4),
        (["check", s["missing"]], 2),
        (["check", s["file"]], 2),
        (["check", s["config-list"]], 6),
        (["check", s["truncated"]], 6),
        (["graft-mtp", s["missing"], "--source", s["truncated"]], 2),
        (["graft-mtp", s["truncated"], "--source", s["only-config"]], 5),
        (["graft-mtp", s["bad-manifest"], "--source", s["truncated"]], 5),
        (["plan", s["missing"]], 2),
        (["plan", s["config-list"]], 2),  # a file given to read is invalid
        (["plan", s["bad-config-json"]], 2),
        (["plan", s["bad-manifest"]], 4),
        (["plan", s["only-config"], "--gpu-mem", "lots"], 2),
        (["plan", str(REAL_CONFIG), "--gpu-mem", "8GiB"], 7),  # no profile fits
        (["serve", s["missing"], "--dry-run"], 2),
        (["serve", s["empty"], "--dry-run"], 4),
        (["serve", s["bad-manifest"], "--dry-run"], 4),
        (["serve", s["truncated"], "--dry-run", "--profile", "single-user", "--profile", "batch"], 2),
        (["bench", "run"], 2),  # nothing to measure
        (["bench", "run", "http://127.0.0.1:9", "--max-tokens", "4"], 8),  # no server there
        (["bench", "compare", "http://127.0.0.1:9", "--label-a", "x"], 2),  # compare's servers are --url-a/-b
        (["bench", "run", "--serve", s["manifested"], "--gpu-mem", "lots"], 2),  # the size serve and plan refuse
        (["bench", "depth", "--serve", s["manifested"], "--device", "tpu"], 2),
        # --gpu-mem-soft and an explicit share both set vLLM's share (beside the hard --gpu-mem it is kept)
        (
            [
                "bench",
                "run",
                "--serve",
                s["manifested"],
                "--gpu-mem",
                "24GiB",
                "--gpu-mem-soft",
                "--",
                "--gpu-memory-utilization",
                "0.5",
            ],
            2,
        ),
        (
            [
                "serve",
                s["truncated"],
                "--dry-run",
                "--gpu-mem",
                "24GiB",
                "--gpu-mem-soft",
                "--",
                "--gpu-memory-utilization",
                "0.5",
            ],
            2,
        ),
        (["eval"], 2),
        (["eval", "served", "--serve", s["manifested"], "--gpu-mem", "lots"], 2),  # serve's own --gpu-mem check
        (["eval", "served", "http://127.0.0.1:9", "--serve", s["manifested"]], 2),
        (["eval", "served", "--serve", s["manifested"], "--device", "tpu"], 2),
        (["recipe", "validate", s["missing"]], 2),
        (["recipe", "validate", s["bad-yaml"]], 2),
        (["recipe", "validate", s["wrong-recipe"]], 2),
        (["recipe", "show", "no-such-recipe"], 2),
        (["demo", "--work", s["file"], "--no-serve"], 2),
    ]


def test_every_command_fails_in_one_line_with_its_exit_code(broken: dict[str, Path], served) -> None:
    wrong = []
    for argv, code in cases(broken, served.repo_id):
        proc = qq(*argv)
        errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
        if proc.returncode != code or len(errors) != 1 or "Traceback" in proc.stderr:
            wrong.append(f"qwenquant {' '.join(argv)} -> exit {proc.returncode} (want {code}):\n{proc.stderr[-1500:]}")
        shutil.rmtree(broken["out"], ignore_errors=True)
    assert not wrong, "\n\n".join(wrong)
    assert broken["file"].read_text() == "not a folder\n"  # no command wrote through a user's file


def test_debug_variable_shows_the_traceback(broken: dict[str, Path]) -> None:
    quiet = qq("plan", str(broken["config-list"]))
    loud = qq("plan", str(broken["config-list"]), debug=True)
    assert quiet.returncode == loud.returncode == 2
    assert not any(ln.startswith("Traceback") for ln in quiet.stderr.splitlines())
    assert any(ln.startswith("Traceback") for ln in loud.stderr.splitlines())
    assert (
        loud.stderr.rstrip().splitlines()[-2]
        == f"error: {broken['config-list'] / 'config.json'} is not a Qwen3.5 model config (not a JSON object)"
    )


def test_a_commit_that_never_existed_is_named_so(served, tmp_path: Path) -> None:
    for extra in ([], ["--re-resolve"]):
        proc = qq("fetch", served.repo_id, "--revision", NEVER, "--out", str(tmp_path / "out"), *extra)
        assert proc.returncode == 3, proc.stderr[-2000:]
        assert f"commit {NEVER} was not found on the server in {served.repo_id}" in proc.stderr
        assert "no longer on the server" not in proc.stderr and "--re-resolve" not in proc.stderr


def test_a_recorded_commit_that_is_gone_is_replaced_only_by_the_same_content(served, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert qq("fetch", served.repo_id, "--out", str(out)).returncode == 0
    record = json.loads((out / "qwenquant-fetch.json").read_text())
    branch_commit = record["commit"]
    record["commit"] = NEVER  # as if the history had been rewritten away from the recorded commit
    (out / "qwenquant-fetch.json").write_text(json.dumps(record))
    proc = qq("fetch", served.repo_id, "--out", str(out))
    # every file still equals the record: the branch's commit is taken, and the fetch says which and why
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"commit {NEVER} is no longer on the server" in proc.stderr and f"using {branch_commit}" in proc.stderr
    assert json.loads((out / "qwenquant-fetch.json").read_text())["commit"] == branch_commit


def test_plan_that_fits_nowhere_exits_7_leading_with_the_weights() -> None:
    proc = qq("plan", str(REAL_CONFIG), "--gpu-mem", "8GiB")
    assert proc.returncode == 7
    verdicts = [ln.strip() for ln in proc.stdout.splitlines() if "FIT" in ln]
    # batch (listed first) does not draft, so it loads no MTP head: 0.79 GiB less than the others; long-context-max
    # keeps the 2.37 GiB embedding table in host memory
    assert verdicts == [
        f"DOES NOT FIT: the weights alone ({w} GiB) exceed the {b} GiB budget (8.00 GiB x {u})"
        for w, b, u in (
            ("14.71", "7.60", "0.95"),
            ("15.50", "7.44", "0.93"),
            ("13.13", "7.44", "0.93"),
            ("15.50", "7.36", "0.92"),
        )
    ]
    assert "largest max-model-len: 0" not in proc.stdout
    assert "error: no serve profile fits in 8GiB: the weights alone (14.71 GiB) exceed" in proc.stderr
    fits = qq("plan", str(REAL_CONFIG), "--gpu-mem", "24GiB")
    assert fits.returncode == 0 and "error:" not in fits.stderr


def test_verify_names_a_file_as_not_a_folder(tmp_path: Path) -> None:
    proc = qq("verify", str(REPO / "README.md"))
    assert proc.returncode == 2  # the usage rule: a file where a folder is asked
    assert f"dir '{REPO / 'README.md'}' is a file" in proc.stderr
    assert "does not exist" not in proc.stderr
