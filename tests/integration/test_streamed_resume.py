"""The streamed gptq stage through the real CLI: SIGKILL at a random decoder layer, re-run, same
root digest; and the lm_head stage taking its calibration from the gptq stage instead of a model."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import freeze_inside_gptq

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, QWENQUANT_THREADS="2", QWENQUANT_NO_PROGRESS="1", PYTHONHASHSEED="0")
ENV.pop("QWENQUANT_GPTQ_ENGINE", None)


def args(source: Path, out: Path) -> list[str]:
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
        "--json",
    ]


@pytest.fixture(scope="module")
def baseline(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("streamed-baseline")
    proc = subprocess.run(
        args(tiny_checkpoint, root / "a"), capture_output=True, text=True, env=ENV, cwd=REPO, timeout=900
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {
        "root_digest": json.loads(proc.stdout)["root_digest"],
        "work": root / "a.work",
        "out": root / "a",
        "stderr": proc.stderr,
    }


def test_sigkill_at_a_random_layer_then_rerun_gives_the_same_digest(
    baseline: dict, tiny_checkpoint: Path, tmp_path: Path
) -> None:
    kill_after = random.Random().randrange(1, 4)  # layers finished before the kill: 1..3 of 4
    out, work = tmp_path / "k", tmp_path / "k.work"
    record = work / "gptq-layers" / f"layer-{kill_after - 1:05d}" / "record.json"
    with open(tmp_path / "first.log", "w") as log:
        proc = subprocess.Popen(args(tiny_checkpoint, out), stdout=subprocess.DEVNULL, stderr=log, env=ENV, cwd=REPO)
        try:
            freeze_inside_gptq(proc, record, tmp_path / "first.log", timeout=600)
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == -signal.SIGKILL
    assert not (work / "gptq.record.json").exists() and list(work.glob(".gptq.*.partial"))
    done = len(list((work / "gptq-layers").glob("layer-*/record.json")))
    assert kill_after <= done <= 4
    kept = "layer 1 is" if done == 1 else f"layers 1-{done} are"
    plan = subprocess.run(
        args(tiny_checkpoint, out) + ["--plan"], capture_output=True, text=True, env=ENV, cwd=REPO, timeout=300
    )
    assert plan.returncode == 0, plan.stderr[-3000:]
    stages = {s["stage"]: s for s in json.loads(plan.stdout)["stages"]}
    assert stages["calibration"]["action"] == "reuse"
    assert (stages["gptq"]["action"], stages["gptq"]["reason"]) == ("run", "no completion record")
    assert stages["gptq"]["note"] == (
        f"resumes at decoder layer {done + 1} of 4; {kept} recorded and replayed; the records' bytes are checked "
        "when it runs"
        if done < 4
        else "all 4 decoder layers are recorded (replayed, none quantized anew); the records' bytes are checked when it runs"
    )

    again = subprocess.run(args(tiny_checkpoint, out), capture_output=True, text=True, env=ENV, cwd=REPO, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    if done < 4:  # the log says it as the plan did, then each layer replayed or quantized, counted the same way
        assert f"gptq: resumes at decoder layer {done + 1} of 4; {kept} recorded and replayed" in again.stderr
        assert f"gptq: decoder layer {done} of 4 replayed" in again.stderr
        assert f"gptq: decoder layer {done + 1} of 4 quantized" in again.stderr
    assert json.loads(again.stdout)["root_digest"] == baseline["root_digest"]
    assert (out / "qwenquant-manifest.json").read_bytes() == (baseline["out"] / "qwenquant-manifest.json").read_bytes()
    assert not (work / "gptq-layers").exists()  # the stage folder holds the layer files now


def test_a_tampered_layer_record_is_redone(baseline: dict, tiny_checkpoint: Path, tmp_path: Path) -> None:
    """A record whose tensors changed on disk is not trusted: that layer and the ones after it rerun."""
    from qwenquant.quantize.engine import layers as L

    root = tmp_path / "layers"
    for i in range(2):
        L.write_layer(root, i, {}, "fp")
    assert L.completed_layers(root, 4, "fp") == (2, "no record")
    f = L.layer_dir(root, 0) / L.TENSORS
    f.write_bytes(f.read_bytes() + b" ")
    assert L.completed_layers(root, 4, "fp") == (0, "tensors changed on disk")
    assert not L.layer_dir(root, 1).exists()
    L.write_layer(root, 0, {}, "fp")
    assert L.completed_layers(root, 4, "other inputs") == (0, "inputs changed")


def test_lm_head_stage_does_not_load_the_model(
    baseline: dict, tiny_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lm_head stage on a streamed gptq output runs with every transformers model constructor
    made to fail, and gives the same quality report as the CLI run."""
    import transformers

    from qwenquant.quantize.stages import calibration as cal
    from qwenquant.quantize.stages import lm_head
    from qwenquant.recipe import load_recipe

    def refuse(*a, **k):
        raise AssertionError("the lm_head stage built a transformers model")

    monkeypatch.setattr(transformers.PreTrainedModel, "__init__", refuse)
    monkeypatch.setattr(transformers.PreTrainedModel, "from_pretrained", classmethod(refuse))
    monkeypatch.setattr(lm_head, "_load_model", refuse)
    (tmp_path / "head").mkdir()
    quality = lm_head.run_head(
        tiny_checkpoint,
        cal.load_tokens(baseline["work"] / "calibration"),
        load_recipe("w4a16-int4head").lm_head,
        baseline["work"] / "gptq",
        tmp_path / "head",
        device="cpu",
    )
    recorded = json.loads((baseline["work"] / "lm_head.record.json").read_text())["result"]
    assert quality == recorded
    assert not (tmp_path / "head" / "head-calibration").exists()  # not carried towards the artifact
