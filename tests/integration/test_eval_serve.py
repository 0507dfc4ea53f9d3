"""`qwenquant eval served --serve ARTIFACT`: the server is started through serve's own preflight and
supervisor, the gate runs against it, and it is stopped afterwards (also on a failed gate, a
server that dies, and Ctrl-C).

STAND-IN: the server is tests/integration/standin.py run as vLLM, not vLLM: it answers
completions from a fixed prompt -> text table and serves vLLM's speculative-decoding counters
growing by set amounts per completion, so the acceptance figures are known exactly. A
real vLLM cannot be made to accept a chosen number of drafts or to fail on demand; the real-vLLM
run of `eval served --serve` is in test_eval_vllm.py.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from standin import build_standin_artifact, serve_env, write_fake_vllm

from helpers import gone

ANSWERS = {"import o": "s\nimport sys", "def f(sel": "f, x):", "while Tr": "ue:\n"}
GATE = {
    "name": "standin",
    "tasks": [
        {"name": "imports", "cases": [{"prompt": "import o", "expect": "s\nimport"}]},
        {"name": "defs", "cases": [{"prompt": "def f(sel", "expect": "f,"}, {"prompt": "while Tr", "expect": "ue:"}]},
    ],
    "acceptance_runs": [{"prompt": "import o", "max_tokens": 8}],
}


@pytest.fixture(scope="module")
def setup(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("evalserve")
    art = build_standin_artifact(tiny_checkpoint, root / "artifact")
    (root / "gate.json").write_text(json.dumps(GATE))
    (root / "answers.json").write_text(json.dumps(ANSWERS))
    return {"artifact": art, "launcher": write_fake_vllm(root / "fakevllm"), "root": root}


def _cmd(s: dict[str, Path], pidfile: Path, *extra: str, mode: str = "good", answers: Path | None = None) -> list[str]:
    return [
        sys.executable,
        "-m",
        "qwenquant",
        "eval",
        "served",
        "--serve",
        str(s["artifact"]),
        "--vllm",
        str(s["launcher"]),
        "--timeout",
        "30",
        "--gate",
        str(s["root"] / "gate.json"),
        *extra,
        "--",
        "--max-model-len",
        "2048",
        "--standin-mode",
        mode,
        "--standin-pidfile",
        str(pidfile),
        "--standin-answers",
        str(answers or s["root"] / "answers.json"),
    ]


def _pids_gone(pidfile: Path) -> bool:
    """Both stand-in processes (server and its helper child) no longer run."""
    return all(gone(int(pid), wait=10.0) for pid in pidfile.read_text().split())


def test_gate_passes_report_keyed_to_root_digest_server_stopped(setup: dict[str, Path], tmp_path: Path) -> None:
    from qwenquant.evaluate.report import report_path, served_kind
    from qwenquant.manifest import load_manifest

    pidfile = tmp_path / "pids"
    r = subprocess.run(
        _cmd(setup, pidfile, "--min-acceptance-length", "2.4", "--json"),
        env=serve_env(setup["launcher"], tmp_path),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    digest = load_manifest(setup["artifact"]).root_digest
    assert out["root_digest"] == digest and out["served"]["profile"] == "single-user"
    assert [(t["name"], t["passed"], t["total"]) for t in out["tasks"]] == [("imports", 1, 1), ("defs", 2, 2)]
    # 3 gate completions + 1 acceptance run, each 4 drafts of 3 tokens with 6 accepted: 1 + 24/16
    m = out["mtp"]
    assert (m["drafts"], m["draft_tokens"], m["accepted_tokens"]) == (16, 48, 24)
    assert m["mean_acceptance_length"] == pytest.approx(2.5)
    assert m["per_position"] == pytest.approx({"0": 0.75, "1": 0.5, "2": 0.25})
    # the default path names the configuration (served_kind): these flags after -- make it another one
    config = {k: out["served"][k] for k in ("activations", "profile", "extra_vllm_flags")}
    assert config["extra_vllm_flags"][:2] == ["--max-model-len", "2048"]
    report = report_path(setup["artifact"], digest, served_kind(**config))
    assert report.name.startswith("artifact.eval-served-bf16.flags") and report.parent == setup["root"]
    assert json.loads(report.read_text())["ok"] is True
    assert "stopping the server" in r.stderr
    assert _pids_gone(pidfile)
    verify = subprocess.run(
        [sys.executable, "-m", "qwenquant", "verify", str(setup["artifact"])],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert verify.returncode == 0, verify.stderr  # the report lies beside the artifact, not in it


def test_failed_gate_exits_8_and_stops_the_server(setup: dict[str, Path], tmp_path: Path) -> None:
    wrong = tmp_path / "answers.json"
    wrong.write_text(json.dumps({**ANSWERS, "while Tr": "y:\n"}))
    pidfile = tmp_path / "pids"
    r = subprocess.run(
        _cmd(setup, pidfile, "--report", str(tmp_path / "r.json"), answers=wrong),
        env=serve_env(setup["launcher"], tmp_path),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert r.returncode == 8, r.stderr[-3000:]
    assert "task defs: 1/2 passed, needs 2" in r.stderr
    assert json.loads((tmp_path / "r.json").read_text())["ok"] is False
    assert _pids_gone(pidfile)


def test_server_that_never_starts_exits_7(setup: dict[str, Path], tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    r = subprocess.run(
        _cmd(setup, pidfile, mode="exit1"),
        env=serve_env(setup["launcher"], tmp_path),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert r.returncode == 7, r.stderr[-3000:]
    assert "exited with code 1 before it was ready" in r.stderr and "Traceback" not in r.stderr
    assert _pids_gone(pidfile)


def test_ctrl_c_stops_the_server(setup: dict[str, Path], tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    proc = subprocess.Popen(
        _cmd(setup, pidfile, mode="nobind"),
        env=serve_env(setup["launcher"], tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not pidfile.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert pidfile.exists(), "the stand-in never started"
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-3000:]
    assert _pids_gone(pidfile)


def test_two_configurations_are_two_reports_never_one_replaced(setup: dict[str, Path], tmp_path: Path) -> None:
    """`eval served --serve ART --activations int8`, then the same without it: two reports at two default
    paths, each naming its activations; the first is not replaced by the second."""
    from qwenquant.manifest import load_manifest

    digest = load_manifest(setup["artifact"]).root_digest
    before = set(setup["root"].glob(f"artifact.eval-served*-{digest[:16]}.json"))
    for extra in (("--activations", "int8"), ()):
        r = subprocess.run(
            _cmd(setup, tmp_path / f"pids{len(extra)}", *extra),
            env=serve_env(setup["launcher"], tmp_path),
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert r.returncode == 0, r.stderr[-3000:]
    made = sorted(set(setup["root"].glob(f"artifact.eval-served*-{digest[:16]}.json")) - before)
    acts = sorted(json.loads(p.read_text())["served"]["activations"] for p in made)
    assert len(made) == 2 and acts == ["bf16", "int8"], made
    assert any(".eval-served-int8." in p.name for p in made)
