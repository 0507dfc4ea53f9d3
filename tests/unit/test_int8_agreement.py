"""benchmarks/int8_agreement.py's pure parts: served against offline log-probs, the int8 effect both ways, the
disagreements it prints (server token counts, kernels, bit-identical settings, the MLP group's scheme), and the
MLP-only variant's config. The serving half needs CUDA vLLM (benchmarks/RESULTS.md)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from benchmarks import int8_agreement as ag


def _arm(lp: list[list[float]], top: list[list[int]] | None = None) -> dict:
    t = torch.tensor(lp)
    return {"lp": t, "top1": torch.tensor(top) if top else torch.zeros_like(t, dtype=torch.long)}


def test_agreement_reports_both_perplexities_and_the_per_token_difference() -> None:
    served = _arm([[-1.0, -2.0], [-3.0, -0.5]], [[1, 2], [3, 4]])
    offline = _arm([[-1.1, -2.0], [-2.9, -0.5]], [[1, 2], [3, 5]])
    row = ag.agreement(served, offline)
    assert row["served_ppl"] == pytest.approx(math.exp(1.625))
    assert row["offline_ppl"] == pytest.approx(math.exp(1.625))
    assert row["abs_diff_mean"] == pytest.approx(0.05, abs=1e-6)
    assert row["abs_diff_max"] == pytest.approx(0.1, abs=1e-6)
    assert row["top1_agree"] == 0.75


def test_effect_compares_the_served_and_the_offline_shift() -> None:
    base = [[-1.0, -2.0, -3.0, -4.0]]
    served = {"bf16": _arm(base), "int8": _arm([[-1.1, -1.9, -3.2, -4.0]])}
    offline = {"bf16": _arm(base), "int8": _arm([[-1.05, -1.95, -3.1, -4.0]])}
    e = ag.effect(served, offline, "int8")
    assert e["served_ppl_change"] == pytest.approx(math.exp(0.05) - 1, rel=1e-4)
    assert e["offline_ppl_change"] == pytest.approx(math.exp(0.025) - 1, rel=1e-4)
    assert e["shift_corr"] == pytest.approx(1.0, abs=1e-6)  # the same shifts, half as large
    assert e["served_tokens_changed"] == 0.75
    assert ag.effect(served, offline, "mlp-int8") is None  # not served: no effect, not a zero


def test_identical_servers_have_no_correlation_rather_than_a_fake_one() -> None:
    same = {"bf16": _arm([[-1.0, -2.0]]), "int8": _arm([[-1.0, -2.0]])}
    e = ag.effect(same, {"bf16": _arm([[-1.0, -2.0]]), "int8": _arm([[-1.1, -2.0]])}, "int8")
    assert e["shift_corr"] is None and e["served_tokens_changed"] == 0


def _setting(lp: list[float], counts: list[int], kernels: dict[str, str]) -> dict:
    return {"served": {**_arm([lp]), "prompt_tokens": counts}, "kernels": kernels}


MARLIN = {"CompressedTensorsWNA16": "MarlinLinearKernel"}


def test_checks_print_every_disagreement() -> None:
    ids = torch.zeros(1, 3, dtype=torch.long)
    settings = {
        "bf16": _setting([-1.0, -2.0], [3], MARLIN),
        "int8": _setting([-1.0, -2.0], [4], {"CompressedTensorsWNA16": "MacheteLinearKernel"}),
        "mlp-int8": {"error": "vLLM exited with 1 before it was ready"},
    }
    flags = ag.checks(settings, ids)
    assert any("int8: the server counted 4 prompt tokens where 3 were sent" in f for f in flags)
    assert any("ran on MacheteLinearKernel, not Marlin" in f for f in flags)
    assert any("bf16 and int8 served bit-identical" in f for f in flags)
    assert any(f.startswith("mlp-int8: no served figures (vLLM exited") for f in flags)


def test_prompt_log_probs_from_a_drafting_server_are_flagged() -> None:
    """vllm #53488: with MTP on, prompt_logprobs come back wrong for some requests."""
    ids = torch.zeros(1, 3, dtype=torch.long)
    drafting = _setting([-1.0, -2.0], [3], MARLIN)
    drafting["served"]["drafting"] = True
    (flag,) = ag.checks({"bf16": drafting}, ids)
    assert flag.startswith("bf16: prompt log-probs read from a server that drafts (MTP on): vllm #53488")


def test_checks_are_quiet_when_everything_agrees() -> None:
    ids = torch.zeros(1, 3, dtype=torch.long)
    settings = {"bf16": _setting([-1.0, -2.0], [3], MARLIN), "int8": _setting([-1.01, -2.0], [3], MARLIN)}
    assert ag.checks(settings, ids) == []


@pytest.mark.parametrize(
    ("kernels", "says"),
    [
        ({"CompressedTensorsWNA16": "HummingLinearKernel"}, "was served as W4A16"),
        ({"CompressedTensorsWNA8Int": "MarlinLinearKernel"}, "ran on MarlinLinearKernel, not Humming"),
        ({"CompressedTensorsW4A8Fp8": "HummingLinearKernel"}, "its inputs are fp8 (e4m3), not int8"),
    ],
)
def test_the_mlp_group_scheme_is_named(kernels: dict[str, str], says: str) -> None:
    assert any(says in f for f in ag.mlp_scheme_flags(kernels))


def test_the_mlp_group_on_humming_with_int8_inputs_is_no_disagreement() -> None:
    assert ag.mlp_scheme_flags({"CompressedTensorsWNA8Int": "HummingLinearKernel"}) == []


def test_the_mlp_variant_adds_a_group_before_the_w4a16_one_and_changes_nothing_else(tmp_path: Path) -> None:
    art = tmp_path / "art"
    art.mkdir()
    group = {
        "targets": ["Linear"],
        "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128, "symmetric": True},
        "input_activations": None,
    }
    (art / "config.json").write_text(json.dumps({"quantization_config": {"config_groups": {"group_0": group}}}))
    (art / "model.safetensors").write_bytes(b"weights")
    out = ag.mlp_variant(art, tmp_path / "variant")
    groups = json.loads((out / "config.json").read_text())["quantization_config"]["config_groups"]
    assert list(groups) == ["group_mlp_w4a8", "group_0"]  # vLLM matches the first group that names a layer
    assert groups["group_0"] == group
    mlp = groups["group_mlp_w4a8"]
    assert mlp["input_activations"] == {
        "num_bits": 8,
        "type": "int",
        "strategy": "token",
        "dynamic": True,
        "symmetric": True,
    }
    assert mlp["weights"] == group["weights"] and mlp["targets"] == [ag.MLP_TARGET]
    assert (out / "model.safetensors").read_bytes() == b"weights"
    assert json.loads((art / "config.json").read_text())["quantization_config"]["config_groups"] == {"group_0": group}
