"""The pure figures of `qwenquant eval`: paired perplexity delta and CI, KL/top-1, metrics parsing, goals."""

from __future__ import annotations

import math

import pytest
import torch

from qwenquant.evaluate import metrics, report, served
from qwenquant.net.prometheus import spec_counters


def test_paired_ppl_delta_ci_and_worse_windows() -> None:
    ref = torch.tensor([2.0, 2.0, 3.0, 1.0])
    arm = ref + torch.tensor([0.1, -0.1, 0.2, 0.0])
    out = metrics.paired_ppl(ref, arm)
    assert out["ppl_reference"] == pytest.approx(math.exp(2.0))
    assert out["ppl"] == pytest.approx(math.exp(2.05))
    assert out["delta_pct"] == pytest.approx(100 * math.expm1(0.05))
    se = torch.tensor([0.1, -0.1, 0.2, 0.0], dtype=torch.float64).std().item() / 2
    assert out["ci95_pct"] == pytest.approx([100 * math.expm1(0.05 - 1.959964 * se), 100 * math.expm1(0.05 + 1.959964 * se)])
    assert (out["windows_worse"], out["windows"]) == (2, 4)


def test_kl_and_top1_of_identical_and_different_logits() -> None:
    logits = torch.randn(2, 5, 11, generator=torch.Generator().manual_seed(0))
    kl, top1 = metrics.window_kl_top1(logits, logits.clone())
    assert torch.allclose(kl, torch.zeros(2), atol=1e-6) and top1.tolist() == [1.0, 1.0]
    flipped = -logits
    kl, top1 = metrics.window_kl_top1(logits, flipped)
    assert (kl > 0.1).all() and (top1 == 0).all()


def test_window_nll_is_cross_entropy_per_window() -> None:
    logits = torch.zeros(1, 3, 4)
    assert metrics.window_nll(logits, torch.tensor([[0, 1, 2]])).tolist() == pytest.approx([math.log(4)])


def test_parse_metrics_sums_label_sets_and_reads_positions() -> None:
    page = "\n".join([
        "# TYPE vllm:spec_decode_num_drafts_total counter",
        'vllm:spec_decode_num_drafts_total{engine="0"} 10.0',
        'vllm:spec_decode_num_drafts_total{engine="1"} 5.0',
        'vllm:spec_decode_num_accepted_tokens_total{engine="0"} 7.0',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="1"} 2.0',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="0"} 5.0',
        "vllm:other_total 99",
    ])
    m = spec_counters(page)
    assert m.drafts == 15.0 and m.accepted == 7.0 and m.per_pos == {0: 5.0, 1: 2.0}
    acc = served.acceptance(spec_counters(""), m)
    assert acc["mean_acceptance_length"] == pytest.approx(1 + 7 / 15)
    assert list(acc["per_position"]) == ["0", "1"]


def test_goals_met_and_not_met() -> None:
    r = {"lm_head": {"ratio": 0.4}, "arms": {"artifact": {"delta_pct": 3.5}}, "mtp": {"change_pct": -2.0}}
    g = report.goals(r)
    assert g["head_kl_ratio"]["met"] and not g["ppl_delta_pct"]["met"] and g["mtp_acceptance_drop_pct"]["met"]


def test_report_goes_beside_the_artifact(tmp_path) -> None:
    p = report.report_path(tmp_path / "art", "ab" * 32)
    assert p.parent == tmp_path and p.name == "art.eval-abababababababab.json"
