"""`qwenquant bench` as subcommands: the help, --json, --out checked before measuring and a measurement kept
when its write fails after it. Against the stand-in servers (tests/integration/standin.py, standin_long.py):
STAND-IN, not vLLM, so a write can be made to fail while the server is mid-stream."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from standin import StandinServer
from standin_long import LongStandin

from helpers import flat

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "QWENQUANT_NO_PROGRESS": "1"}


def qq(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "qwenquant", *argv], env=ENV, capture_output=True, text=True, timeout=300
    )


HEAVY = ("torch", "transformers", "llmcompressor", "compressed_tensors", "huggingface_hub", "datasets", "PIL")
PROBE = """
import contextlib, io, json, sys
from qwenquant.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    rc = main(sys.argv[1:])
print(json.dumps({"rc": rc, "out": out.getvalue(),
                  "heavy": sorted(m for m in sys.modules if m.split(".")[0] in HEAVY)}))
""".replace("HEAVY", repr(HEAVY))


def _help(*argv: str) -> dict:
    r = subprocess.run(
        [sys.executable, "-c", PROBE, *argv, "--help"], env=ENV, capture_output=True, text=True, timeout=60
    )
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("sub", ["run", "compare", "depth", "soak", "turns"])
def test_bench_help_lists_the_subcommands_with_examples_and_imports_nothing_heavy(sub: str) -> None:
    top = _help("bench")
    assert top["rc"] == 0 and f"qwenquant bench {sub} " in top["out"] and top["heavy"] == []
    h = _help("bench", sub)
    assert h["rc"] == 0 and "Examples:" in h["out"] and f"qwenquant bench {sub} " in h["out"], sub
    assert h["heavy"] == [], h["heavy"]


def test_no_bench_command_function_is_longer_than_80_lines() -> None:
    tree = ast.parse((REPO / "src/qwenquant/commands/bench.py").read_text())
    long = {
        f.name: f.end_lineno - f.lineno + 1
        for f in tree.body
        if isinstance(f, ast.FunctionDef) and f.end_lineno - f.lineno + 1 > 80
    }
    assert long == {}


def test_run_json_prints_the_report_on_stdout(tmp_path: Path) -> None:
    with StandinServer() as s:
        r = qq(
            "bench",
            "run",
            s.url,
            "--prompts",
            "narrative",
            "--sampling",
            "greedy",
            "--thinking",
            "off",
            "--max-tokens",
            "8",
            "--repeats",
            "1",
            "--out",
            str(tmp_path / "b.json"),
            "--json",
        )
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["mode"] == "run" and rep["schema_version"] == 2 and rep["json_path"] == str(tmp_path / "b.json")
    assert json.loads((tmp_path / "b.json").read_text())["targets"] == rep["targets"]


@pytest.mark.parametrize("mode", ["depth", "soak", "turns"])
def test_long_modes_json(tmp_path: Path, mode: str) -> None:
    extra = {
        "depth": ["--depths", "1024"],
        "soak": ["--tokens", "200", "--window", "100"],
        "turns": ["--turn-tokens", "1000"],
    }[mode]
    with LongStandin() as s:
        r = qq("bench", mode, s.url, *extra, "--out", str(tmp_path / "b.json"), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["mode"] == mode


def test_out_on_a_full_disk_is_refused_before_measuring(tmp_path: Path) -> None:
    """A disk with less room than a report needs is the user's to free: exit 2 before any request."""
    from qwenquant.bench.output import check_out
    from qwenquant.errors import UsageError

    need = shutil.disk_usage(tmp_path).free * 2
    with pytest.raises(UsageError, match="bytes free") as e:
        check_out(tmp_path / "b.json", "run", min_free=need)
    assert e.value.message.endswith(f"bytes free, the report needs up to {need:,}")  # how much it needs
    assert "another disk" in e.value.hint


def test_a_write_that_fails_after_measuring_keeps_the_measurement(tmp_path: Path) -> None:
    """The --out folder becomes a file while the ladder runs: the table is still printed, the JSON goes to the
    temporary folder, and a line says where (exit 0: the measurement was made)."""
    folder = tmp_path / "reports"
    folder.mkdir()
    with LongStandin() as s:
        s.step = 0.03
        p = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "qwenquant",
                "bench",
                "depth",
                s.url,
                "--depths",
                "1024",
                "--out",
                str(folder / "depth.json"),
            ],
            env=ENV,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 60
        while not s.bodies and time.monotonic() < deadline:
            time.sleep(0.005)
        shutil.rmtree(folder)
        folder.write_text("a file where the folder was\n")
        out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    assert "depth ladder" in out and "ok" in out
    spare = Path(tempfile.gettempdir()) / f"depth-{p.pid}.json"
    joined = "".join(err.split())  # rich may fold a long path anywhere
    assert "".join(f"could not write {folder / 'depth.json'}".split()) in joined, err
    assert "".join(f"the report goes to {spare}".split()) in joined, err
    assert json.loads(spare.read_text())["rungs"][0]["ok"] is True
    spare.unlink()


def test_compare_takes_typed_configurations(tmp_path: Path) -> None:
    """The same label twice, and a URL beside serve options, are refused before anything is measured."""
    r = qq(
        "bench",
        "compare",
        "--url-a",
        "http://127.0.0.1:9",
        "--url-b",
        "http://127.0.0.1:9",
        "--label-a",
        "x",
        "--label-b",
        "x",
        "--out",
        str(tmp_path / "c.json"),
    )
    assert r.returncode == 2 and "both configurations are labelled 'x'" in flat(r.stderr)
    r = qq(
        "bench",
        "compare",
        "--url-a",
        "http://127.0.0.1:9",
        "--profile-a",
        "batch",
        "--url-b",
        "http://127.0.0.1:9",
        "--out",
        str(tmp_path / "c.json"),
    )
    assert r.returncode == 2 and "configuration A names a URL and serve options" in flat(r.stderr)


def test_compare_serves_each_configuration_with_its_own_vllm_flags(tiny_checkpoint: Path, tmp_path: Path) -> None:
    """Flags after -- go to both servers, --vllm-arg-b only to B's (the stand-in as vLLM: no real server needed
    to see which flags each configuration was started with)."""
    from standin import build_standin_artifact, serve_env, write_fake_vllm

    art = build_standin_artifact(tiny_checkpoint, tmp_path / "artifact")
    launcher = write_fake_vllm(tmp_path / "fakevllm")
    out = tmp_path / "cmp.json"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "qwenquant",
            "bench",
            "compare",
            "--serve",
            str(art),
            "--vllm",
            str(launcher),
            "--timeout",
            "60",
            "--label-a",
            "on",
            "--label-b",
            "off",
            "--vllm-arg-b=--speculative-config",
            "--vllm-arg-b=null",
            "--prompts",
            "narrative",
            "--sampling",
            "greedy",
            "--thinking",
            "off",
            "--max-tokens",
            "8",
            "--repeats",
            "1",
            "--rounds",
            "1",
            "--out",
            str(out),
            "--",
            "--max-model-len",
            "2048",
        ],
        env=serve_env(launcher, tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    by = {t["label"]: t for t in json.loads(out.read_text())["targets"]}
    assert by["on"]["extra_vllm_flags"] == ["--max-model-len", "2048"]
    assert by["off"]["extra_vllm_flags"] == ["--max-model-len", "2048", "--speculative-config", "null"]
    assert by["off"]["config"] == "-- --max-model-len 2048 --speculative-config null"
    assert "ratio on / off" in r.stdout


@pytest.mark.parametrize(
    "argv",
    [
        ["depth", "--concurrency", "3", "--depths", "1024"],
        ["soak", "--concurrency", "3", "--tokens", "100"],
        ["run", "--max-concurrency", "3", "--max-tokens", "8"],
    ],
)
def test_streams_above_what_a_running_server_lists_are_refused_before_measuring(
    tmp_path: Path, argv: list[str]
) -> None:
    with LongStandin() as s:
        s.max_num_seqs = 2
        r = qq("bench", argv[0], s.url, *argv[1:], "--out", str(tmp_path / "b.json"))
        sent = list(s.bodies)
    assert r.returncode == 2 and "3 is above the profile's max_num_seqs 2: the server would queue" in flat(r.stderr)
    assert sent == [] and not (tmp_path / "b.json").exists()
