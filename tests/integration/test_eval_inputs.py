"""`qwenquant eval` checks its inputs before it measures: the artifact verifies, the reference is the
source the manifest records (or --reference-unverified says it need not be), both models have the
same shapes, and a report of another run is never replaced.

The "artifact" is the committed reference model with a manifest whose source section records the
reference's files, as quantize's source stage writes it (no GPTQ run: the checks are what is tested;
the measured figures of a real artifact are test_eval_reference.py's)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from helpers import flat, qq, write_source_manifest

FAST = ("--windows", "2", "--window-len", "32")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from qwenquant.testbed.tiny import build_tiny_checkpoint, reference_model

    root = tmp_path_factory.mktemp("evalinputs")
    source = reference_model.build_reference_checkpoint(root / "source")
    art = Path(shutil.copytree(source, root / "artifact"))
    # an artifact's config.json is not its source's (quantize adds quantization_config); one byte will do
    (art / "config.json").write_text((art / "config.json").read_text() + "\n")
    write_source_manifest(art, source, {"name": "none"})
    other = build_tiny_checkpoint(root / "other", variant="random", seed=0)  # MLP 512 wide, the reference 768
    return {"source": source, "artifact": art, "other": other}


def _reports(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.glob("*.json")}


def test_an_artifact_that_fails_verify_is_not_measured(models: dict[str, Path], tmp_path: Path) -> None:
    art = Path(shutil.copytree(models["artifact"], tmp_path / "artifact"))
    (art / "tokenizer_config.json").write_text("{}")
    proc = qq("eval", "offline", str(art), "--reference", str(models["source"]), *FAST)
    assert proc.returncode == 4, proc.stderr
    assert f"{art} does not verify" in flat(proc.stderr) and "tokenizer_config.json" in flat(proc.stderr)
    assert _reports(tmp_path) == {}


@pytest.mark.parametrize("which", ["artifact", "other"])
def test_a_reference_that_is_not_the_recorded_source_is_refused(
    models: dict[str, Path], tmp_path: Path, which: str
) -> None:
    """The artifact itself, or another model, as the "bf16 reference": exit 4, the file named."""
    report = tmp_path / "r.json"
    proc = qq(
        "eval", "offline", str(models["artifact"]), "--reference", str(models[which]), "--report", str(report), *FAST
    )
    assert proc.returncode == 4, proc.stderr
    assert f"--reference {models[which]}: config.json" in flat(proc.stderr)
    assert "--reference-unverified" in flat(proc.stderr) and "unexpected error" not in proc.stderr
    assert not report.exists()


def test_a_reference_of_another_shape_is_one_line_even_when_unverified(models: dict[str, Path], tmp_path: Path) -> None:
    proc = qq(
        "eval",
        "offline",
        str(models["artifact"]),
        "--reference",
        str(models["other"]),
        "--reference-unverified",
        "--report",
        str(tmp_path / "r.json"),
        *FAST,
    )
    assert proc.returncode == 2, proc.stderr
    assert "config.json intermediate_size is 512, the artifact's is 768: not the same model" in flat(proc.stderr)
    assert "NOT checked" in flat(proc.stderr) and "Traceback" not in proc.stderr


def test_reports_of_another_run_are_never_replaced(models: dict[str, Path], tmp_path: Path) -> None:
    """The recorded source passes and is marked verified; the same run again replaces its own
    report; an unverified reference says so, and a report of another run is left alone (exit 2)."""
    report = tmp_path / "r.json"
    ok = qq(
        "eval", "offline", str(models["artifact"]), "--reference", str(models["source"]), "--report", str(report), *FAST
    )
    assert ok.returncode == 0, ok.stderr[-2000:]
    first = json.loads(report.read_text())
    assert first["reference_check"]["verified"] is True and first["reference_check"]["files"] >= 5
    again = qq(
        "eval", "offline", str(models["artifact"]), "--reference", str(models["source"]), "--report", str(report), *FAST
    )
    assert again.returncode == 0, again.stderr[-2000:]

    copy = Path(shutil.copytree(models["source"], tmp_path / "copy"))
    before = report.read_bytes()
    other_run = qq(
        "eval",
        "offline",
        str(models["artifact"]),
        "--reference",
        str(copy),
        "--reference-unverified",
        "--report",
        str(report),
        *FAST,
    )
    assert other_run.returncode == 2, other_run.stderr
    assert f"report {report} holds a report of another run" in flat(other_run.stderr)
    assert report.read_bytes() == before

    second = tmp_path / "unverified.json"
    loud = qq(
        "eval",
        "offline",
        str(models["artifact"]),
        "--reference",
        str(copy),
        "--reference-unverified",
        "--report",
        str(second),
        *FAST,
    )
    assert loud.returncode == 0, loud.stderr[-2000:]
    assert "NOTE: the reference was not checked" in flat(loud.stderr)
    assert json.loads(second.read_text())["reference_check"]["verified"] is False


def test_an_unwritable_report_path_is_refused_before_measuring(models: dict[str, Path], tmp_path: Path) -> None:
    missing = tmp_path / "no-such-folder" / "r.json"
    proc = qq(
        "eval",
        "offline",
        str(models["artifact"]),
        "--reference",
        str(models["source"]),
        "--report",
        str(missing),
        *FAST,
    )
    assert proc.returncode == 2, proc.stderr
    assert f"--report {missing}: folder {missing.parent} not found" in flat(proc.stderr)
    assert "perplexity" not in proc.stdout + proc.stderr


@pytest.mark.parametrize("body", ["", "one line of text\n"])
def test_a_text_too_short_for_two_windows_asks_for_a_longer_text(
    models: dict[str, Path], tmp_path: Path, body: str
) -> None:
    """No --windows value can help a text shorter than two windows (the least a run accepts): the hint asks
    for more text, not for a --windows that is then refused."""
    text = tmp_path / "short.txt"
    text.write_text(body)
    proc = qq(
        "eval", "offline", str(models["artifact"]), "--reference", str(models["source"]), "--text", str(text), *FAST
    )
    assert proc.returncode == 2, proc.stderr
    said = flat(proc.stderr)
    assert f"--text {text} has 0 windows of 32 tokens" in said
    assert "hint: pass a longer --text (at least 2 windows: 64 tokens), or a shorter --window-len" in said
    assert "--windows 0" not in said
