"""benchmarks/phase_model.py: the FLOP counts and the projections quantize_arms.py prints (pure functions)."""

from __future__ import annotations

import pytest

from benchmarks import phase_model as pm


def _gdn_layer() -> dict[str, tuple[int, int]]:
    return {
        "linear_attn.in_proj_qkv": (10240, 5120),
        "linear_attn.in_proj_z": (6144, 5120),
        "!linear_attn.in_proj_a": (48, 5120),
        "linear_attn.out_proj": (5120, 6144),
        "mlp.gate_proj": (17408, 5120),
        "mlp.up_proj": (17408, 5120),
        "mlp.down_proj": (5120, 17408),
    }


def test_shared_inputs_count_one_hessian_and_ignored_modules_none() -> None:
    f = pm.layer_flops(_gdn_layer(), tokens=1000)
    # qkv/z share one 5120 Hessian, gate/up another; out_proj 6144, down_proj 17408; in_proj_a is ignored
    assert f["hessian_flops"] == 2.0 * 1000 * (5120**2 * 2 + 6144**2 + 17408**2)
    assert f["forward_flops"] == 2.0 * 1000 * sum(o * i for o, i in _gdn_layer().values())
    assert f["solve_flops"] == sum(2.0 * o * i * i for k, (o, i) in _gdn_layer().items() if not k.startswith("!"))


def _arm(layer0: float, stages: dict[str, float]) -> dict:
    types = ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 + ["full_attention"]
    secs = [layer0, 3.0, 3.0, 4.0, 3.0, 3.0, 3.0, 4.0]
    return {
        "layer_types": types,
        "gptq_layers": [{"layer": i, "seconds": s} for i, s in enumerate(secs)],
        "stages": [{"stage": k, "seconds": v} for k, v in stages.items()],
    }


def test_projection_counts_layer0_excess_once_and_scales_only_whole_checkpoint_stages() -> None:
    stages = {
        "source": 10.0,
        "calibration": 10.0,
        "gptq": 26.0 + 60 + 5,
        "lm_head": 50.0,
        "check": 4.0,
        "manifest": 6.0,
    }
    cold = pm.project_qwenquant(_arm(63.0, stages), bytes_ratio=4.0)
    assert cold["per_layer_seconds"] == {"linear_attention": 3.0, "full_attention": 4.0}
    parts = cold["parts"]
    assert parts["layers"] == 48 * 3.0 + 16 * 4.0
    assert parts["layer0_one_time"] == pytest.approx(60.0)  # not x 4
    assert parts["gptq_after_loop (x bytes)"] == pytest.approx(5.0 * 4)  # no split logged: all of it
    assert parts["source (x bytes)"] == 40.0 and parts["lm_head (fixed)"] == 50.0
    assert parts["calibration (fixed)"] == 10.0
    warm = pm.project_qwenquant(_arm(3.0, dict(stages, gptq=26.0 + 5)), bytes_ratio=4.0)
    assert cold["total_seconds"] - warm["total_seconds"] == pytest.approx(60.0)


def test_gptq_tail_scales_each_logged_part_by_what_it_reads() -> None:
    stages = {"gptq": 26.0 + 12.0, "check": 1.0}
    arm = dict(
        _arm(3.0, stages),
        gptq_tail={"head_calibration": 4.0, "rest_shards": 3.0, "layer_links": 0.5, "identity_proof": 2.0},
    )
    parts = pm.project_qwenquant(arm, bytes_ratio=3.0)["parts"]
    assert parts["gptq_after_loop (fixed)"] == pytest.approx(7.0)  # head calibration, the tensors outside the layers
    assert parts["gptq_after_loop (x layers)"] == pytest.approx(0.5 * 64 / 8)
    # identity proof, record and whatever was not logged (2.0 + 2.5 of the 12 s) with the bytes
    assert parts["gptq_after_loop (x bytes)"] == pytest.approx((12.0 - 7.0 - 0.5) * 3.0)
    unsplit = pm.project_qwenquant(_arm(3.0, stages), bytes_ratio=3.0)["parts"]
    assert unsplit["gptq_after_loop (x bytes)"] == pytest.approx(12.0 * 3.0)


def test_3090_rates_move_each_part_by_its_own_peak() -> None:
    split = {"forward": 1.0, "hessian": 1.0, "solve": 1.0, "host": 2.0}
    flops = {"forward_flops": 1.0, "hessian_flops": 1.0, "solve_flops": 1.0}
    tc = pm.layer_on("RTX 3090", split, flops, "tensor-core", layer_bytes=1e9)
    fp = pm.layer_on("RTX 3090", split, flops, "fp32", layer_bytes=1e9)
    assert tc["forward"] == pytest.approx(989 / 71) and tc["hessian"] == pytest.approx(989 / 71)
    assert fp["hessian"] == pytest.approx(67 / 35.6) and tc["solve"] == pytest.approx(67 / 35.6)
    assert tc["host"] == 2.0  # host-bound: as measured, PCIe 4 (1 GB in 0.04 s) only a floor


def test_oneshot_projection_counts_its_untimed_last_layer_and_setup_once() -> None:
    types = ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 + ["full_attention"]
    per_layer = [13.0, 3.0, 3.0, 4.0, 3.0, 3.0, 3.0]  # layers 0..6 (the last one is not timed apart)
    arm = {
        "layer_types": types,
        "per_layer_seconds": per_layer,
        "oneshot_seconds": sum(per_layer) + 4.0 + 2.0,
        "load_seconds": 5.0,
        "save_seconds": 3.0,
    }
    p = pm.project_oneshot(arm, bytes_ratio=4.0)
    assert p["parts"]["layers"] == 48 * 3.0 + 16 * 4.0
    assert p["parts"]["layer0_one_time"] == pytest.approx(10.0)
    assert p["parts"]["setup_and_tail_once"] == pytest.approx(2.0)  # 6 s outside the timed layers, 4 of them layer 7
    assert p["parts"]["load (x bytes)"] == 20.0 and p["parts"]["save (x bytes)"] == 12.0
