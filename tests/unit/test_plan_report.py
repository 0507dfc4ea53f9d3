"""What `qwenquant plan` prints for the real model's config: a profile serve refuses is never called
"fits", each figure is the one its JSON holds, a length above the model's positions says so, and small
sizes read in MiB."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from helpers import run_cli

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "src" / "qwenquant" / "data" / "qwen3_8-27b.config.json"


def _sections(text: str) -> dict[str, str]:
    """profile name -> its block of the text plan (from its `profile NAME:` line to the next blank line)."""
    return {m.group(1): m.group(0) for m in re.finditer(r"^profile ([\w-]+):.*?(?=\n\n|\Z)", text, re.M | re.S)}


def test_a_profile_serve_refuses_is_never_said_to_fit(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A model of 4,096 positions: single-user's 32,768 is refused whatever the memory; its block says
    DOES NOT FIT and nowhere "fits:"; batch (4,096) still fits."""
    cfg = json.loads(CONFIG.read_text())
    cfg["text_config"]["max_position_embeddings"] = 4096
    small = tmp_path / "config.json"
    small.write_text(json.dumps(cfg))
    code, out, err = run_cli(capsys, "plan", str(small), "--gpu-mem", "24GiB")
    assert code == 0, err
    blocks = _sections(out)
    assert (
        "DOES NOT FIT: max-model-len 32768 is above the model's max_position_embeddings 4096" in blocks["single-user"]
    )
    assert "fits:" not in blocks["single-user"] and "fits:" not in blocks["long-context"]
    assert "  fits: " in blocks["batch"]
    code, out, err = run_cli(
        capsys, "plan", str(small), "--gpu-mem", "24GiB", "--gpus", "2", "--split", "pipeline", "-p", "single-user"
    )
    assert code == 7, err
    assert "fits on every stage" not in out and "fits:" not in out


@pytest.mark.parametrize("extra", [[], ["--gpus", "2"], ["--gpus", "2", "--split", "pipeline"]])
def test_each_largest_length_is_the_figure_the_json_holds(capsys: pytest.CaptureFixture[str], extra: list[str]) -> None:
    """The text's "largest max-model-len" is the JSON's largest_len_1 / largest_len_all (one figure); one
    above the model's 262,144 positions says that serve takes at most those."""
    code, out, _ = run_cli(capsys, "plan", str(CONFIG), "--gpu-mem", "24GiB", *extra)
    assert code == 0
    code, js, _ = run_cli(capsys, "plan", str(CONFIG), "--gpu-mem", "24GiB", "--json", *extra)
    profiles = json.loads(js)["profiles"]
    blocks = _sections(out) if len(extra) < 3 else {}
    for name, b in profiles.items():
        if not blocks:
            break
        line = re.search(r"largest max-model-len: .*", blocks[name]).group(0)
        assert line.startswith(f"largest max-model-len: {b['largest_len_1']:,} for 1 sequence"), line
        if b["max_num_seqs"] > 1:
            assert f", {b['largest_len_all']:,} for {b['max_num_seqs']} sequences" in line
        above = b["largest_len_1"] > 262144
        assert ("above the model's 262,144 positions: serve takes at most 262,144" in line) == above, line
    if len(extra) == 3:
        for b in profiles.values():
            assert f"a largest max-model-len of {b['largest_len_1']:,}" in out


def test_a_tiny_budget_reads_in_mib(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "plan", str(CONFIG), "--gpu-mem", "1MiB", "-p", "batch")
    assert code == 7
    assert "0.00 GiB" not in err and "exceed the 0.95 MiB budget (1.00 MiB x 0.95)" in err, err
