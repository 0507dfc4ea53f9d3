"""`qwenquant check --activations int8`: each refusal on a crafted artifact (exit 6, one line naming it), and
the count of weight groups whose scale vLLM re-quantizes to 0, on scales with known numbers.

Artifacts are test_check's `Fx` (config + safetensors in llm-compressor's layout), with config groups
rewritten and scale tensors filled with chosen values.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from test_check import Fx

from qwenquant.check.activations import layer_stats, vllm_layer
from qwenquant.checkpoint.tensorfile import checkpoint_refs
from qwenquant.cli import main
from qwenquant.errors import CheckError

from helpers import flat


def _bf16(x: float) -> bytes:
    return struct.pack("<f", x)[2:]  # the top half of a float32 (x chosen exactly representable)


def fill_scales(art: Path, value: float = 0.01, special: dict[str, dict[int, float]] | None = None) -> None:
    """Every weight_scale tensor set to `value`, except special[tensor][flat index]."""
    special = special or {}
    for name, ref in checkpoint_refs(art).items():
        if not name.endswith(".weight_scale"):
            continue
        n = ref.nbytes // 2
        vals = [special.get(name, {}).get(i, value) for i in range(n)]
        with open(ref.path, "r+b") as f:
            f.seek(ref.start)
            f.write(b"".join(_bf16(v) for v in vals))


def crafted(tmp_path: Path, **special: dict[int, float]) -> Path:
    art = Fx().write(tmp_path / "art")
    fill_scales(art, 0.0078125, {k.replace("__", "."): v for k, v in special.items()})
    return art


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["check", *args])
    cap = capsys.readouterr()
    return code, cap.out, flat(cap.err)


def test_a_qualifying_artifact_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, str(crafted(tmp_path)), "--activations", "int8")
    assert code == 0, err
    assert "all 14 rules pass" in out
    assert "int8 activations: the artifact qualifies; 0 of 22528 weight groups have a scale that becomes 0" in flat(out)


def test_without_the_flag_no_scale_is_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    art = crafted(tmp_path, lm_head__weight_scale={0: -0.5})
    assert run(capsys, str(art))[0] == 0
    assert run(capsys, str(art), "--activations", "bf16")[0] == 0


def _rewrite_group(art: Path, group: str, **weights: object) -> None:
    cfg = json.loads((art / "config.json").read_text())
    cfg["quantization_config"]["config_groups"][group]["weights"].update(weights)
    (art / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize(
    "group, weights, words",
    [
        (
            "group_0",
            {"symmetric": False},
            "quantization_config.config_groups.group_0: asymmetric weights (zero points; "
            "model.language_model.layers.0.linear_attn.in_proj_qkv and 24 more): Marlin's "
            "int8 path takes only symmetric uint4b8 weights and stops at load",
        ),
        (
            "group_1",
            {"strategy": "channel", "group_size": None},
            "quantization_config.config_groups.group_1: strategy 'channel', group_size None (lm_head): int8 activations "
            "need group-wise scales",
        ),
        (
            "group_1",
            {"num_bits": 8},
            "quantization_config.config_groups.group_1: 8-bit int weights (lm_head): vLLM's "
            "Marlin takes int8 activations only with 4-bit weights",
        ),
    ],
)
def test_scheme_refusals(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], group: str, weights: dict, words: str
) -> None:
    art = crafted(tmp_path)
    _rewrite_group(art, group, **weights)
    code, out, err = run(capsys, str(art), "--activations", "int8", "--json")
    assert code == CheckError.exit_code == 6
    assert "problem(s) vLLM would refuse" in err
    found = [f"{f['where']}: {f['message']}" for f in json.loads(out)["int8_activations"]["findings"]]
    assert any(x.startswith(words) for x in found), found
    # the general W4A16 rule refuses these groups too (for bf16 serving as well)
    assert any(f["rule"] == "quant-config" for f in json.loads(out)["findings"])


def test_negative_scale_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    art = crafted(tmp_path, **{"model.language_model.layers.3.self_attn.k_proj.weight_scale": {1: -0.5, 5: -0.25}})
    code, out, err = run(capsys, str(art), "--activations", "int8", "--json")
    assert code == 6
    doc = json.loads(out)
    assert doc["ok"] is False and "int8-activations" in doc["rules_run"]
    (f,) = doc["int8_activations"]["findings"]
    # the fused layer vLLM loads: q, k and v share one scale tensor
    assert f["where"] == "model.language_model.layers.3.self_attn.qkv_proj.weight_scale"
    assert f["message"].startswith("2 of 1536 group scales are negative") and "vllm #48905" in f["message"]


def test_zero_scale_groups_counted_per_kind(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Scales 2^-7 everywhere; one group per layer raised to 2^-1 sets the layer's largest, so 2^-7 / 2^-1 * 4096 =
    64 stays; groups at 2^-14 (2^-13 of the largest: 0.5 rounds to even 0) and 2^-15 become 0, 2^-13 (1) stays."""
    big, zero_a, zero_b, keeps = 2.0**-1, 2.0**-14, 2.0**-15, 2.0**-13
    spec = {
        "model.language_model.layers.0.mlp.down_proj.weight_scale": {0: big, 3: zero_a, 7: zero_b, 9: keeps},
        "model.language_model.layers.1.mlp.down_proj.weight_scale": {0: big, 2: zero_a},
        "model.language_model.layers.0.mlp.gate_proj.weight_scale": {0: big},
        "model.language_model.layers.0.mlp.up_proj.weight_scale": {4: zero_b, 5: zero_b, 6: keeps},
        "lm_head.weight_scale": {10: big, 11: zero_a},
    }
    art = Fx().write(tmp_path / "art")
    fill_scales(art, 2.0**-7, spec)
    code, out, err = run(capsys, str(art), "--activations", "int8", "--json")
    assert code == 0, err
    doc = json.loads(out)["int8_activations"]
    assert doc["zero_groups"] == 6 and doc["groups"] == 22528
    assert {k: v for k, v in doc["zero_groups_by_kind"].items() if v} == {
        "down_proj": 3,
        "gate_up_proj": 2,
        "lm_head": 1,
    }
    assert (
        "int8 activations: 6 of 22528 weight groups have a scale below 1/8192 of their layer's largest and "
        "become 0 when vLLM re-quantizes the scales to int16 (down_proj 3, gate_up_proj 2, lm_head 1)"
    ) in err


def test_a_profile_that_opts_in_runs_the_rule_without_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from qwenquant.recipe import load_recipe

    from helpers import write_test_manifest

    art = crafted(tmp_path, lm_head__weight_scale={0: -0.5})
    recipe = load_recipe("w4a16-int4head").canonical()
    write_test_manifest(art, recipe)
    assert run(capsys, str(art))[0] == 0
    recipe["serve"]["profiles"]["batch"]["activations"] = "int8"
    write_test_manifest(art, recipe)
    code, _, err = run(capsys, str(art))
    assert code == 6 and "int8-activations at lm_head.weight_scale" in err
    assert run(capsys, str(art), "--activations", "bf16")[0] == 0


def test_fused_names_and_the_stats_of_one_layer() -> None:
    import numpy as np

    assert vllm_layer("model.layers.3.self_attn.k_proj") == "model.layers.3.self_attn.qkv_proj"
    assert vllm_layer("model.layers.0.linear_attn.in_proj_z") == "model.layers.0.linear_attn.in_proj_qkvz"
    assert vllm_layer("lm_head") == "lm_head"
    s = layer_stats(
        "mtp.layers.0.mlp.down_proj", [np.array([1.0, 1 / 8192, 1 / 8000, 0.0, -1.0], np.float32)], "bfloat16"
    )
    assert (s.kind, s.groups, s.negative, s.zero) == ("mtp down_proj", 5, 1, 2)


def test_a_layer_with_one_group_per_row_is_refused(tmp_path: Path) -> None:
    """A layer whose input is no wider than its group_size has one scale column: vLLM 0.32's Marlin
    (kernels/linear/mixed_precision/marlin.py) then sets no input_global_scale, and the int8 path multiplies
    the token scales by None at the first forward."""
    import numpy as np

    from qwenquant.check.activations import int8_findings
    from qwenquant.check.facts import read_artifact

    facts = read_artifact(crafted(tmp_path))
    one = layer_stats("model.layers.0.mlp.down_proj", [np.full(8, 0.01, np.float32)], "bfloat16", per_row=1)
    many = layer_stats("model.layers.0.mlp.gate_up_proj", [np.full(16, 0.01, np.float32)], "bfloat16", per_row=2)
    report = int8_findings(facts, {one.layer: one, many.layer: many})
    assert [(f.where, f.message.split(":")[0]) for f in report.findings] == [
        ("model.layers.0.mlp.down_proj.weight_scale", "one scale group per row (the input is no wider than group_size)")
    ]
