"""`qwenquant quantize --device cpu --gpus 2`: the gptq stage as a 2-process gloo job under
torch.distributed.run on the tiny model, through the real CLI. Its artifact against the one-process artifact within the tolerance
of docs/distributed-gptq.md; a rank killed mid-run fails the whole job and a re-run resumes to the
same bytes as an uninterrupted 2-process run; Ctrl-C stops every rank; usage errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import REPO, flat, run_cli

pytestmark = pytest.mark.slow

ENV = dict(os.environ, QWENQUANT_THREADS="2", QWENQUANT_NO_PROGRESS="1", PYTHONHASHSEED="0")
ENV.pop("QWENQUANT_GPTQ_ENGINE", None)


def args(source: Path, out: Path, gpus: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "qwenquant",
        "quantize",
        str(source),
        "--recipe",
        "w4a16-int4head",
        "--calibration",
        "tiny-demo",
        "--source-unverified",
        "--out",
        str(out),
        "--device",
        "cpu",
        "--gpus",
        str(gpus),
        "--json",
    ]


def quantize(source: Path, out: Path, gpus: int) -> dict:
    proc = subprocess.run(args(source, out, gpus), capture_output=True, text=True, env=ENV, cwd=REPO, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    return {
        "out": out,
        "root_digest": result["root_digest"],
        "stderr": proc.stderr,
        "timings": result["timings"],
        "ranks": result["timings"]["gptq_ranks"],
    }


@pytest.fixture(scope="module")
def arts(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("distgptq")
    return {1: quantize(tiny_checkpoint, root / "one", 1), 2: quantize(tiny_checkpoint, root / "two", 2)}


def test_two_processes_within_the_tolerance_of_one(arts: dict, tiny_checkpoint: Path) -> None:
    """docs/distributed-gptq.md: every tensor but the int4 codes byte-identical, decoder layer 0's
    codes within 1 %, every module's weight error within 2 % of the one-process artifact's."""
    from benchmarks.artifact_compare import compare_artifacts

    diff = compare_artifacts(arts[1]["out"], arts[2]["out"], tiny_checkpoint)
    assert diff.codes_total == 8 * sum(  # every int4 code of both artifacts was compared
        int(r[1][0]) * int(r[1][1]) for r in _packed_shapes(arts[1]["out"])
    )
    assert diff.first_layer_codes[1] > 0 and len(diff.weight_errors) == len(diff.modules)
    assert diff.problems() == [], diff.to_dict()
    assert "gptq: 2 processes under torch.distributed.run (gloo on the CPU)" in arts[2]["stderr"]


def _packed_shapes(folder: Path) -> list:
    from qwenquant.checkpoint.tensorfile import checkpoint_refs

    return [(n, r.shape) for n, r in checkpoint_refs(folder).items() if n.endswith(".weight_packed")]


def test_the_record_says_two_processes_and_both_verify(arts: dict) -> None:
    for n in (1, 2):
        m = json.loads((arts[n]["out"] / "qwenquant-manifest.json").read_text())
        assert m["stages"]["gptq"]["params"].get("ranks") == (2 if n == 2 else None)
        v = subprocess.run(
            [sys.executable, "-m", "qwenquant", "verify", str(arts[n]["out"])],
            capture_output=True,
            text=True,
            env=ENV,
            cwd=REPO,
            timeout=300,
        )
        assert v.returncode == 0, v.stderr[-2000:]


def test_each_rank_forwarded_its_own_share(arts: dict) -> None:
    """The two ranks calibrated on disjoint shares that add up to the whole set. (The two artifacts
    may still come out byte-identical: the Hessian sums differ only in their order, which flips an
    int4 code only by chance, and whether it does depends on the CPU; docs/distributed-gptq.md.)"""
    assert arts[1]["ranks"] == []  # one process: no job, no per-rank figures
    shares = arts[2]["ranks"]
    assert [r["rank"] for r in shares] == [0, 1]
    assert all(r["samples"] > 0 and r["tokens"] > 0 for r in shares), shares
    cal = json.loads((arts[2]["out"] / "qwenquant-manifest.json").read_text())["calibration"]
    assert sum(r["samples"] for r in shares) == cal["num_samples"]
    assert sum(r["tokens"] for r in shares) == cal["token_total"]
    # each rank timed its layers' phases, the collective ones included; only rank 0 writes
    for r in shares:
        assert len(r["phase_seconds"]) == len(r["seconds_per_layer"]) > 0
        for ph in r["phase_seconds"]:
            assert {"calibrate", "reduce", "gptq", "gather", "barrier", "rebuild", "forward"} <= set(ph), ph
            assert ("write" in ph) == (r["rank"] == 0), ph
    # the run's own timings (quantize --json) carry rank 0's phases and the stage's parts after its loop
    t = arts[2]["timings"]
    assert t["gptq_layers"] == shares[0]["phase_seconds"] and t["stages"]["gptq"] > 0
    assert {"head_calibration", "layer_links", "rest_shards", "index_and_calibration", "identity_proof"} <= set(
        t["gptq_tail"]
    ), t["gptq_tail"]


def _ranks_of(parent: int) -> dict[int, int]:
    """RANK -> pid of the worker processes below `parent` (torch.distributed.run's children)."""
    children: dict[int, list[int]] = {}
    ranks: dict[int, int] = {}
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            ppid = int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
            env = (p / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(p.name))
        rank = [e for e in env if e.startswith(b"RANK=")]
        if rank:
            ranks[int(p.name)] = int(rank[0][5:])
    out, todo = {}, [parent]
    while todo:
        for pid in children.get(todo.pop(), []):
            if pid in ranks:
                out[ranks[pid]] = pid
            todo.append(pid)
    return out


def _start_and_wait_for_layer(source: Path, out: Path, log: Path, layer: int) -> tuple[subprocess.Popen, dict]:
    record = out.with_name(out.name + ".work") / "gptq-layers" / f"layer-{layer:05d}" / "record.json"
    proc = subprocess.Popen(args(source, out, 2), stdout=subprocess.DEVNULL, stderr=open(log, "w"), env=ENV, cwd=REPO)
    deadline = time.monotonic() + 600
    while not record.exists():
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, "the layer record never appeared"
        time.sleep(0.02)
    ranks = _ranks_of(proc.pid)
    assert sorted(ranks) == [0, 1], ranks
    return proc, ranks


def _launcher_of(parent: int) -> int:
    """The pid of `parent`'s torch.distributed.run child."""
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if int((p / "stat").read_text().rsplit(")", 1)[1].split()[1]) == parent:
                    return int(p.name)
            except (OSError, IndexError, ValueError):
                continue
    raise AssertionError(f"no launcher below {parent}")


def _gone(pid: int) -> bool:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_a_killed_rank_fails_the_job_and_a_rerun_resumes_to_the_same_bytes(
    arts: dict, tiny_checkpoint: Path, tmp_path: Path
) -> None:
    out, work = tmp_path / "k", tmp_path / "k.work"
    proc, ranks = _start_and_wait_for_layer(tiny_checkpoint, out, tmp_path / "first.log", 0)
    # frozen first: rank 0 cannot end the stage without rank 1, so the check still holds at the kill
    os.kill(ranks[1], signal.SIGSTOP)
    assert not (work / "gptq.record.json").exists() and not _gone(ranks[1]), "the stage ended before the kill"
    os.kill(ranks[1], signal.SIGKILL)
    assert proc.wait(timeout=120) == 5
    err = flat((tmp_path / "first.log").read_text())
    assert "error: gptq rank 1 of 2 was killed by signal 9 without reporting an error" in err, err[-2000:]
    assert "re-run the same command to resume" in err
    assert all(_gone(pid) for pid in ranks.values())
    assert not (work / "gptq.record.json").exists() and not list(work.glob(".gptq-ranks.*"))
    done = len(list((work / "gptq-layers").glob("layer-*/record.json")))
    assert 1 <= done <= 4

    again = subprocess.run(
        args(tiny_checkpoint, out, 2), capture_output=True, text=True, env=ENV, cwd=REPO, timeout=900
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"gptq: resumes at decoder layer {done + 1} of 4" in again.stderr or done == 4
    assert json.loads(again.stdout)["root_digest"] == arts[2]["root_digest"]
    assert not list(work.glob(".gptq-ranks.*")) and not (work / "gptq-layers").exists()


def test_ctrl_c_stops_every_rank(arts: dict, tiny_checkpoint: Path, tmp_path: Path) -> None:
    proc, ranks = _start_and_wait_for_layer(tiny_checkpoint, tmp_path / "c", tmp_path / "c.log", 0)
    launcher = _launcher_of(proc.pid)
    frozen = [proc.pid, launcher, *ranks.values()]  # quantize, torchrun and the ranks, frozen while the check runs
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    assert not (tmp_path / "c.work" / "gptq.record.json").exists(), "the stage ended before the Ctrl-C"
    proc.send_signal(signal.SIGINT)
    for pid in frozen:
        os.kill(pid, signal.SIGCONT)
    assert proc.wait(timeout=120) == 130, (tmp_path / "c.log").read_text()[-2000:]
    assert all(_gone(pid) for pid in [launcher, *ranks.values()])
    assert not (tmp_path / "c.work" / "gptq.record.json").exists()


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--gpus", "2"], "--gpus 2 but 0 CUDA GPU(s) visible"),
        (["--gpus", "auto", "--device", "cpu"], "--gpus auto counts CUDA GPUs, and --device cpu uses none"),
        (["--gpus", "0"], "--gpus must be a positive number or 'auto', got '0'"),
    ],
)
def test_usage_errors(
    tiny_checkpoint: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    extra: list[str],
    message: str,
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    code, _, err = run_cli(
        capsys,
        "quantize",
        str(tiny_checkpoint),
        "--source-unverified",
        "--calibration",
        "tiny-demo",
        "--out",
        str(tmp_path / "u"),
        *extra,
    )
    assert code == 2 and message in err, err
    assert not (tmp_path / "u.work").exists()
