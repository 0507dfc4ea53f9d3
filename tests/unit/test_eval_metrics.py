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
    assert out.ppl_reference == pytest.approx(math.exp(2.0))
    assert out.ppl == pytest.approx(math.exp(2.05))
    assert out.delta_pct == pytest.approx(100 * math.expm1(0.05))
    se = torch.tensor([0.1, -0.1, 0.2, 0.0], dtype=torch.float64).std().item() / 2
    t3 = 3.182446  # t quantile 0.975 at 3 degrees of freedom (4 windows), not the normal 1.96
    assert out.ci95_pct == pytest.approx([100 * math.expm1(0.05 - t3 * se), 100 * math.expm1(0.05 + t3 * se)])
    assert (out.windows_worse, out.windows) == (2, 4)


@pytest.mark.parametrize(
    ("p", "df", "want"),
    [
        (0.975, 1, 12.706205),
        (0.975, 3, 3.182446),
        (0.975, 31, 2.039513),
        (0.995, 10, 3.169273),
        (0.025, 31, -2.039513),
        (0.975, 1e7, 1.959964),
    ],
)
def test_t_quantile_matches_the_tables(p: float, df: float, want: float) -> None:
    assert metrics.t_quantile(p, df) == pytest.approx(want, abs=2e-6)


def test_mean_ci95_is_wider_than_the_normal_interval_at_32_windows() -> None:
    v = torch.linspace(0.0, 1.0, 32, dtype=torch.float64)
    mean, (lo, hi) = metrics.mean_ci95(v)
    se = float(v.std()) / math.sqrt(32)
    assert mean == pytest.approx(0.5)
    assert (hi - lo) / (2 * 1.959964 * se) == pytest.approx(2.039513 / 1.959964)  # about 4% wider
    assert metrics.mean_ci95(torch.tensor([0.3]))[1] != metrics.mean_ci95(torch.tensor([0.3]))[1]  # nan: one window


def test_kl_tail_quantiles_of_per_token_kl() -> None:
    per_token = torch.cat([torch.zeros(990), torch.full((9,), 1.0), torch.tensor([10.0])])
    tail = metrics.kl_tail(per_token)
    assert set(tail) == {"kl_p99", "kl_p999"}
    assert 0.0 < tail["kl_p99"] <= 1.0 < tail["kl_p999"] <= 10.0
    logits = torch.randn(2, 5, 11, generator=torch.Generator().manual_seed(1))
    assert torch.allclose(metrics.token_kl(logits, -logits).mean(dim=1), metrics.window_kl_top1(logits, -logits)[0])


def test_kl_tail_support_names_the_window_the_p999_rests_on() -> None:
    """One window holds every large per-token KL: the p99.9 is reported with a bootstrap interval over
    windows that spans the resamples with and without that window, and the window is named."""
    kl = torch.full((32, 255), 0.01, dtype=torch.float64)
    kl[7, 100:120] = torch.linspace(0.5, 0.9, 20, dtype=torch.float64)
    t = metrics.kl_tail_support(kl)
    assert t["value"] == pytest.approx(float(torch.quantile(kl.flatten(), 0.999)))
    assert t["windows_above"] == 1 and t["windows"] == 32 and t["top_window"] == 7 and t["top_window_share"] == 1.0
    assert t["max"] == {"window": 7, "token": 119, "kl": pytest.approx(0.9)}
    lo, hi = t["ci95"]
    assert lo == pytest.approx(0.01) and hi > t["value"]  # resamples without window 7 have no tail at all
    assert metrics.kl_tail_support(kl) == t  # a fixed seed: the same interval every run
    from qwenquant.evaluate.reporttext import kl_tail_line

    with_text = t.model_copy(update={"max": t.max.model_copy(update={"text": "x = 1"})})
    assert kl_tail_line(with_text).startswith(
        f"artifact KL p99.9 {t['value']:.4f}, 95% bootstrap interval over windows [0.0100, "
    )
    assert "tail tokens lie in 1 of 32 windows, 100% of them in window 7" in kl_tail_line(t)


def test_mtp_figures_pair_int4_and_bf16_heads_on_the_same_windows() -> None:
    from qwenquant.evaluate.offline import mtp_figures

    ref = torch.tensor([0.6, 0.5, 0.7, 0.6])
    bf16 = torch.tensor([0.58, 0.5, 0.66, 0.6])
    int4 = bf16 - torch.tensor([0.01, 0.02, 0.0, 0.01])
    same = torch.tensor([0.97, 1.0, 0.95, 0.96])
    m = mtp_figures(
        {
            "reference": {"mtp_agree": ref},
            "artifact": {"mtp_agree": int4, "mtp_agree_bf16": bf16, "mtp_same_draft": same},
        }
    )
    assert m["reference"]["agree"] == pytest.approx(0.6) and m["reference"]["acceptance_length_1"] == pytest.approx(1.6)
    assert m["artifact_bf16_mtp"]["agree"] == pytest.approx(0.585)
    assert m["int4_vs_bf16"]["delta_points"] == pytest.approx(-1.0)
    lo, hi = m["int4_vs_bf16"]["ci95_points"]
    assert lo < -1.0 < hi and hi - lo == pytest.approx(2 * 3.182446 * 0.816497 / 2, rel=1e-5)  # t, 3 df
    assert m["int4_vs_bf16"]["same_draft"] == pytest.approx(0.97)
    assert m["change_pct"] == pytest.approx(100 * (1.575 / 1.6 - 1))
    assert mtp_figures({"reference": {}, "artifact": {}}).to_json() == {}  # no MTP head: no MTP figures
    from qwenquant.evaluate.reporttext import mtp_lines

    lines = mtp_lines(m)
    assert any(
        ln.startswith("MTP head on the artifact's states: bf16 58.50%, as shipped 57.50%: -1.00 points, 95% CI (t) [")
        and ln.endswith("; the same first draft at 97.00% of positions")
        for ln in lines
    )


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
    page = "\n".join(
        [
            "# TYPE vllm:spec_decode_num_drafts_total counter",
            'vllm:spec_decode_num_drafts_total{engine="0"} 10.0',
            'vllm:spec_decode_num_drafts_total{engine="1"} 5.0',
            'vllm:spec_decode_num_accepted_tokens_total{engine="0"} 7.0',
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="1"} 2.0',
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="0"} 5.0',
            "vllm:other_total 99",
        ]
    )
    m = spec_counters(page)
    assert m.drafts == 15.0 and m.accepted == 7.0 and m.per_pos == {0: 5.0, 1: 2.0}
    acc = served.acceptance(spec_counters(""), m)
    assert acc["mean_acceptance_length"] == pytest.approx(1 + 7 / 15)
    assert list(acc["per_position"]) == ["0", "1"]


def test_goals_met_and_not_met() -> None:
    from qwenquant.evaluate.reportparts import Arm, Arms, LmHead, Mtp, OfflineFigures

    r = OfflineFigures.model_construct(
        lm_head=LmHead.model_construct(ratio=0.4),
        arms=Arms.model_construct(artifact=Arm.model_construct(delta_pct=3.5)),
        mtp=Mtp.model_construct(change_pct=-2.0),
    )
    g = report.goals(r)
    assert g.head_kl_ratio and g.head_kl_ratio.met and g.ppl_delta_pct and not g.ppl_delta_pct.met
    assert g.mtp_acceptance_drop_pct is not None and g.mtp_acceptance_drop_pct.met
    no_mtp = report.goals(r.model_copy(update={"mtp": Mtp()}))
    assert no_mtp.mtp_acceptance_drop_pct is None and "mtp_acceptance_drop_pct" not in no_mtp.to_json()


def test_report_goes_beside_the_artifact(tmp_path) -> None:
    p = report.report_path(tmp_path / "art", "ab" * 32)
    assert p.parent == tmp_path and p.name == "art.eval-abababababababab.json"
