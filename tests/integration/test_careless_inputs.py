"""Careless inputs over every command: each row is one ordinary mistake and the kind of mistake it
is; its expected exit code comes from the rules next to the exit-code table (commands/_app.py
EXIT_RULES, repeated in the README). Any exit 1, "unexpected error" or traceback fails the test, as
does more than one `error:` line or a file of the user's that changed.

The models are the demo's trained tiny reference, built in code; the "artifact" is a copy of it with a
manifest that records the reference as its source, as quantize's source stage does (no GPTQ run: the
rows test what each command checks before it works)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from qwenquant.commands._app import EXIT_RULE

from helpers import write_source_manifest

REPO = Path(__file__).resolve().parents[2]
REAL_CONFIG = REPO / "src" / "qwenquant" / "data" / "qwen3_8-27b.config.json"
DEAD = "http://127.0.0.1:9"  # nothing listens on the discard port


def _qq(argv: list[str], **extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "QWENQUANT_DEBUG"}
    env.update({"QWENQUANT_NO_PROGRESS": "1", "QWENQUANT_THREADS": "1", **extra})
    return subprocess.run(
        [sys.executable, "-m", "qwenquant", *argv], capture_output=True, text=True, timeout=300, env=env, cwd=REPO
    )


@pytest.fixture(scope="module")
def m(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The folders and files the rows point at."""
    from qwenquant.testbed.tiny import build_tiny_checkpoint, reference_model

    t = tmp_path_factory.mktemp("careless")
    src = reference_model.build_reference_checkpoint(t / "source")
    art = Path(shutil.copytree(src, t / "artifact"))
    (art / "config.json").write_text((art / "config.json").read_text() + "\n")  # an artifact's config is its own
    write_source_manifest(art, src)
    other = build_tiny_checkpoint(t / "other", variant="random", seed=0)  # another model (MLP 512, not 768)
    tampered = Path(shutil.copytree(art, t / "tampered"))
    (tampered / "tokenizer_config.json").write_text("{}")
    noshard = Path(shutil.copytree(art, t / "noshard"))
    shard = sorted(noshard.glob("model-0*.safetensors"))[0]
    shard.unlink()
    nosize = Path(shutil.copytree(src, t / "nosize"))
    cfg = json.loads((nosize / "config.json").read_text())
    del cfg["text_config"]["hidden_size"]
    (nosize / "config.json").write_text(json.dumps(cfg))
    files = {
        "empty.jsonl": "",
        "bad.jsonl": '{"text": \n',
        "nofield.jsonl": '{"body": "x"}\n',
        "badgate.json": "{",
        "gate-nocases.json": '{"tasks": [{"name": "x"}]}',
        "bad.yaml": "x: [\n",
    }
    for name, text in files.items():
        (t / name).write_text(text)
    (t / "latin1.txt").write_bytes(b"caf\xe9 " * 50)
    shipped = (REPO / "src" / "qwenquant" / "data" / "calibration" / "tiny-demo.yaml").read_text()
    for data in ("empty", "bad", "nofield"):
        (t / f"calib-{data}.yaml").write_text(shipped.replace("path: tiny-demo.jsonl", f"path: {data}.jsonl"))
    int4mtp = (REPO / "src" / "qwenquant" / "data" / "recipes" / "tiny-reference-int4mtp.yaml").read_text()
    assert '">=0.28.0,<0.33"' in int4mtp
    (t / "int4mtp-open.yaml").write_text(int4mtp.replace('">=0.28.0,<0.33"', '">=0.28.0"'))
    (t / "notes.txt").write_text("not a folder\n")
    (t / "mine.png").write_bytes(b"\x89PNG a picture of the user's")  # beside a new mine.json
    (t / "soak.json").write_text(json.dumps({"schema_version": 2, "mode": "soak", "tool": "qwenquant bench soak"}))
    (t / "emptydir").mkdir()
    (t / "foreign.json").write_text('{"a": 1}')
    truncated = Path(shutil.copytree(art, t / "truncated"))
    shard = sorted(truncated.glob("model-0*.safetensors"))[0]
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    corrupt = Path(shutil.copytree(art, t / "corrupt"))
    shard = sorted(corrupt.glob("model-0*.safetensors"))[0]
    data = bytearray(shard.read_bytes())
    data[8:20] = b"\xff" * 12  # the header's first bytes: not JSON any more
    shard.write_bytes(bytes(data))
    return {
        k: str(v)
        for k, v in {
            "t": t,
            "src": src,
            "art": art,
            "other": other,
            "tampered": tampered,
            "noshard": noshard,
            "nosize": nosize,
            "missing": t / "missing",
            "truncated": truncated,
            "corrupt": corrupt,
        }.items()
    }


def rows(m: dict[str, str]) -> list[tuple[str, list[str]]]:
    """(kind of mistake, argv) for every command."""
    t, src, art, missing = m["t"], m["src"], m["art"], m["missing"]
    out = ["--out", f"{t}/q"]
    q = ["--recipe", "tiny-reference", "--plan"]
    return [
        # usage: a path that does not exist is 2 in every command
        ("usage", ["verify", missing]),
        ("usage", ["check", missing]),
        ("usage", ["plan", missing]),
        ("usage", ["serve", missing, "--dry-run"]),
        ("usage", ["publish", missing, "--repo", "a/b", "--dry-run"]),
        ("usage", ["graft-mtp", missing, "--source", src]),
        ("usage", ["graft-mtp", art, "--source", missing]),
        ("usage", ["quantize", missing, *out]),
        ("usage", ["eval", "offline", missing, "--reference", src]),
        ("usage", ["eval", "offline", art, "--reference", missing]),
        ("usage", ["bench", "run", "--serve", missing]),
        ("usage", ["eval", "served", "--serve", missing]),
        ("usage", ["verify", f"{t}/notes.txt"]),
        ("usage", ["fetch", "--offline", "--out", missing]),
        # a file where a folder is asked: exit 2 and kept, --force or not
        ("usage", ["fetch", "someone/model", "--out", f"{t}/notes.txt", "--force"]),
        ("usage", ["quantize", src, "--recipe", "tiny-reference", "--out", f"{t}/notes.txt", "--force"]),
        ("usage", ["quantize", src, "--recipe", "tiny-reference", "--out", f"{t}/q", "--work", f"{t}/notes.txt"]),
        # usage: an empty folder is not an artifact
        ("usage", ["plan", f"{t}/emptydir"]),
        ("usage", ["check", f"{t}/emptydir"]),
        # usage: values
        ("usage", ["plan", str(REAL_CONFIG), "--gpu-mem", "abc"]),
        ("usage", ["serve", art, "--port", "70000", "--dry-run"]),
        ("usage", ["serve", art, "--gpu-mem", "0", "--dry-run"]),
        ("usage", ["bench", "run", "127.0.0.1:8000"]),
        ("usage", ["bench", "depth", DEAD, "--max-tokens", "0"]),
        ("usage", ["eval", "served", "localhost:8000"]),
        ("usage", ["eval", "served", "http://127.0.0.1:99999"]),
        ("usage", ["eval", "served", DEAD, "--gate", "none"]),
        ("usage", ["eval", "served", DEAD, "--gate", "none", "--needle", "--needle-max-len", "-5"]),
        ("usage", ["quantize", src, "--device", "tpu", *out]),
        # usage: an option that needs a GPU this machine does not have (serve's --gpus / --gpu-mem on the CPU build:
        # tests/integration/test_serve_supervisor.py)
        ("usage", ["quantize", src, "--source-unverified", "--device", "cuda", *q, *out]),
        ("usage", ["fetch", "not a repo id!", *out]),
        ("usage", ["recipe", "show", "no-such-recipe"]),
        # input-file: files given to read, paths to write
        ("input-file", ["quantize", src, "--calibration", f"{t}/calib-empty.yaml", *q, *out]),
        ("input-file", ["quantize", src, "--calibration", f"{t}/calib-bad.yaml", *q, *out]),
        ("input-file", ["quantize", src, "--calibration", f"{t}/calib-nofield.yaml", *q, *out]),
        ("input-file", ["quantize", src, "--recipe", f"{t}/bad.yaml", *out]),
        ("input-file", ["eval", "offline", art, "--reference", src, "--text", f"{t}/none.txt"]),
        ("input-file", ["eval", "offline", art, "--reference", src, "--text", f"{t}/latin1.txt"]),
        ("input-file", ["eval", "served", DEAD, "--gate", f"{t}/badgate.json"]),
        ("input-file", ["eval", "served", DEAD, "--gate", f"{t}/gate-nocases.json"]),
        ("input-file", ["eval", "offline", art, "--reference", src, "--report", f"{missing}/r.json"]),
        ("input-file", ["bench", "soak", DEAD, "--out", f"{missing}/b.json"]),
        ("input-file", ["quantize", src, "--out", f"{art}/q", "--recipe", "tiny-reference"]),
        ("input-file", ["quantize", src, "--out", f"{t}/q", "--work", f"{t}/q", "--recipe", "tiny-reference"]),
        ("input-file", ["quantize", src, "--out", f"{t}/q", "--work", f"{src}/w", "--recipe", "tiny-reference"]),
        ("input-file", ["recipe", "validate", f"{t}/bad.yaml"]),
        # report paths: one rule for every command that writes a report (nothing qwenquant did not write is
        # replaced; a report of another kind is not either; nothing goes inside an artifact)
        ("input-file", ["bench", "run", DEAD, "--out", f"{art}/config.json"]),
        ("input-file", ["bench", "depth", DEAD, "--out", f"{art}/tokenizer.json"]),
        ("input-file", ["bench", "soak", DEAD, "--out", f"{t}/notes.txt"]),
        ("input-file", ["bench", "turns", DEAD, "--out", f"{art}/new-report.json"]),
        ("input-file", ["bench", "depth", DEAD, "--out", f"{t}/soak.json"]),
        ("input-file", ["bench", "run", DEAD, "--out", f"{t}/mine.json"]),  # mine.png beside it is the user's
        ("input-file", ["eval", "served", DEAD, "--report", f"{art}/config.json"]),
        ("input-file", ["eval", "offline", art, "--reference", src, "--report", f"{t}/notes.txt"]),
        ("input-file", ["plan", f"{t}/notes.txt"]),
        ("input-file", ["plan", f"{t}/foreign.json"]),
        # an int4-MTP recipe whose vLLM range is open: refused where it is read, before any GPTQ
        ("input-file", ["recipe", "validate", f"{t}/int4mtp-open.yaml"]),
        ("input-file", ["quantize", src, "--recipe", f"{t}/int4mtp-open.yaml", "--plan", *out]),
        # a folder nothing can be written in (/proc: read-only for root too)
        ("input-file", ["quantize", src, "--recipe", "tiny-reference", "--out", "/proc/qwenquant-careless/q"]),
        ("input-file", ["bench", "turns", DEAD, "--out", "/proc/qwenquant-careless.json"]),
        ("input-file", ["eval", "offline", art, "--reference", src, "--report", "/proc/qwenquant-careless.json"]),
        # record: bytes that differ from their record
        ("record", ["verify", m["tampered"]]),
        ("record", ["eval", "offline", m["tampered"], "--reference", src]),
        ("record", ["eval", "offline", art, "--reference", art]),
        ("record", ["eval", "offline", art, "--reference", m["other"]]),
        ("record", ["graft-mtp", art, "--source", m["other"]]),
        ("record", ["plan", m["noshard"]]),
        ("record", ["serve", m["noshard"], "--dry-run"]),
        ("record", ["plan", m["truncated"]]),
        ("record", ["plan", m["corrupt"]]),
        ("record", ["check", m["truncated"]]),
        ("record", ["check", m["corrupt"]]),
        ("record", ["publish", m["tampered"], "--repo", "a/b", "--dry-run"]),
        # stage: a folder that exists but cannot be a source
        ("stage", ["quantize", m["nosize"], "--source-unverified", *q, *out]),
        ("stage", ["quantize", f"{t}/emptydir", "--source-unverified", *q, *out]),
        ("stage", ["graft-mtp", art, "--source", f"{t}/emptydir"]),
        ("usage", ["demo", "--work", f"{t}/notes.txt", "--no-serve"]),  # a file where a folder is asked
        # check, serve/plan, measure
        ("check", ["check", src]),
        ("serve", ["plan", str(REAL_CONFIG), "--gpu-mem", "8GiB"]),
        ("serve", ["plan", art, "--profile", "single-user"]),  # 32768 > the tiny model's 4096 positions
        ("measure", ["bench", "run", DEAD, "--max-tokens", "4"]),
        ("measure", ["eval", "served", DEAD]),
    ]


def _snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_every_careless_input_gets_its_rule_s_code_in_one_line(m: dict[str, str]) -> None:
    table = rows(m)
    before = {k: _snapshot(Path(m[k])) for k in ("src", "art", "other")}
    mine = {n: Path(m["t"], n).read_bytes() for n in ("notes.txt", "mine.png", "soak.json")}
    with ThreadPoolExecutor(max_workers=2) as pool:
        procs = list(pool.map(lambda row: _qq(row[1]), table))
    wrong = []
    for (kind, argv), proc in zip(table, procs, strict=True):
        errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
        bad = (
            proc.returncode != EXIT_RULE[kind]
            or proc.returncode == 1
            or len(errors) != 1
            or "unexpected error" in proc.stderr
            or "Traceback" in proc.stderr
        )
        if bad:
            wrong.append(
                f"[{kind}] qwenquant {' '.join(argv)} -> exit {proc.returncode} (want {EXIT_RULE[kind]}):\n"
                f"{proc.stderr[-1200:]}"
            )
    assert not wrong, f"{len(wrong)} of {len(table)} rows:\n\n" + "\n\n".join(wrong)
    assert {k: _snapshot(Path(m[k])) for k in ("src", "art", "other")} == before  # no row wrote into them
    assert not Path(m["t"], "q").exists()
    assert {n: Path(m["t"], n).read_bytes() for n in mine} == mine and not Path(m["t"], "mine.json").exists()


@pytest.mark.parametrize("command", ["plan", "check"])
def test_a_damaged_shard_or_a_folder_that_is_no_artifact_is_named_with_its_fix(m: dict[str, str], command: str) -> None:
    """A truncated shard, a shard whose header is not JSON: the file named, the hint says it is damaged
    (re-copy it, verify lists every file that differs); an empty folder is not an artifact."""
    for case in ("truncated", "corrupt"):
        shard = sorted(Path(m[case]).glob("model-0*.safetensors"))[0]
        proc = _qq([command, m[case]])
        said = " ".join(proc.stderr.split())
        assert proc.returncode == EXIT_RULE["record"], proc.stderr
        assert f"error: {shard}" in said and "vLLM would refuse" not in said, said
        assert (
            f"hint: the file is damaged: re-copy it; `qwenquant verify {m[case]}` lists every file that differs" in said
        ), said
    proc = _qq([command, f"{m['t']}/emptydir"])
    said = " ".join(proc.stderr.split())
    assert proc.returncode == EXIT_RULE["usage"], said
    assert f"error: {m['t']}/emptydir holds no config.json and no safetensors file: it is not an artifact" in said
    if command == "plan":
        for name, what in (("notes.txt", "is not JSON"), ("foreign.json", "is not a Qwen3.5 model config")):
            proc = _qq(["plan", f"{m['t']}/{name}"])
            said = " ".join(proc.stderr.split())
            assert proc.returncode == EXIT_RULE["input-file"] and f"error: {m['t']}/{name} {what}" in said, said
            assert "hint: pass an artifact folder or a Qwen3.5 config.json" in said, said


def test_a_disk_too_small_for_the_stages_left_is_said_before_any_stage(m: dict[str, str], tmp_path: Path) -> None:
    """The free-space check (as fetch's): a source whose config implies a model far larger than any
    disk here (MLP 2^40 wide) is refused before the first stage, naming how much the stages need."""
    big = Path(shutil.copytree(m["src"], tmp_path / "big"))
    cfg = json.loads((big / "config.json").read_text())
    cfg["text_config"]["intermediate_size"] = 2**40
    (big / "config.json").write_text(json.dumps(cfg))
    proc = _qq(
        ["quantize", str(big), "--source-unverified", "--recipe", "tiny-reference", "--out", str(tmp_path / "q")]
    )
    assert proc.returncode == EXIT_RULE["stage"], proc.stderr
    said = " ".join(proc.stderr.split())
    assert "the stages left (gptq, lm_head, mtp, textonly) write about" in said and "GiB is free on" in said
    assert not (tmp_path / "q.work").exists() and not (tmp_path / "q").exists()


def test_the_fetch_hint_names_the_extra_file_instead_of_looping(served, tmp_path: Path) -> None:
    """A fetched folder with a file of the user's: the hint says to remove that file (fetch keeps
    it, so "re-run fetch" would loop); once it is gone the folder verifies."""
    out = tmp_path / "fetched"
    assert _qq(["fetch", served.repo_id, "--out", str(out)]).returncode == 0
    (out / "notes.txt").write_text("mine\n")
    again = _qq(["fetch", served.repo_id, "--out", str(out)])  # fetch keeps the file, and says so
    assert again.returncode == 0 and "kept 1 file(s) the repo does not list: notes.txt" in " ".join(
        again.stderr.split()
    )
    proc = _qq(["fetch", "--offline", "--out", str(out)])
    assert proc.returncode == EXIT_RULE["record"], proc.stderr
    said = " ".join(proc.stderr.split())
    assert f"remove the files the fetch did not write (fetch keeps them): {out / 'notes.txt'}" in said
    assert "re-run `qwenquant fetch" not in said
    (out / "notes.txt").unlink()
    assert _qq(["fetch", "--offline", "--out", str(out)]).returncode == 0


@pytest.mark.parametrize(
    "name, value, allowed, argv",
    [
        (
            "QWENQUANT_THREADS",
            "-2",
            "an integer from 0 to 4096",
            [
                "quantize",
                "{src}",
                "--recipe",
                "tiny-reference",
                "--source-unverified",
                "--device",
                "cpu",
                "--out",
                "{t}/q",
            ],
        ),
        ("QWENQUANT_FETCH_BACKOFF", "-1", "a number from 0 to 600", ["fetch", "Qwen/Qwen3.8-27B", "--out", "{t}/f"]),
        ("QWENQUANT_DIST_TIMEOUT_MIN", "0", "an integer from 1 to 10080", ["recipe", "list"]),
        ("QWENQUANT_MAX_GPU_MEM", "-23.5", "a number > 0", ["verify", "{art}"]),
        ("QWENQUANT_DEBUG", "yes", "0 or 1", ["verify", "{art}"]),
        ("QWENQUANT_NO_PROGRESS", "yes", "0 or 1", ["verify", "{art}"]),
        ("QWENQUANT_RECIPES_DIR", "/nonexistent", "an existing folder", ["recipe", "list"]),
    ],
)
def test_a_variable_of_the_readme_table_out_of_range_is_one_line_and_exit_2(
    m: dict[str, str], name: str, value: str, allowed: str, argv: list[str]
) -> None:
    """An environment variable out of its range stops any command before it starts: exit 2 (usage),
    one line naming the variable and the range; nothing written."""
    proc = _qq([a.format(**m) for a in argv], **{name: value})
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert proc.returncode == EXIT_RULE["usage"], proc.stderr
    assert errors == [f"error: {name} must be {allowed}, got {value!r}"], proc.stderr
    assert not Path(m["t"], "q").exists() and not Path(m["t"], "f").exists()
