"""`qwenquant quantize --hessian-precision`: the default tensor-core Hessians against llm-compressor's
own float32 arithmetic (`--hessian-precision fp32`), on the committed tiny reference model, on the CPU.

The setting is recorded (recipe and gptq stage inputs in the manifest), a changed setting re-runs
gptq and `--plan` says why, and the default artifact lies within the tolerance the engine documents
for another summation order of the same Hessians (docs/distributed-gptq.md, benchmarks/artifact_compare.py:
everything but the int4 codes byte-identical, decoder layer 0's codes within 1 %, each module's
weight error within 2 % of the fp32 artifact's). The eval figures of the default path are checked
against the CI bands by tests/integration/test_eval_reference.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qwenquant.testbed.tiny import reference_model

from helpers import qq

pytestmark = pytest.mark.slow


def _quantize(source: Path, out: Path, *extra: str) -> dict:
    proc = qq(
        "quantize",
        str(source),
        "--recipe",
        "tiny-reference",
        "--source-unverified",
        "--out",
        str(out),
        "--device",
        "cpu",
        "--json",
        *extra,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {
        "out": out,
        "result": json.loads(proc.stdout),
        "manifest": json.loads((out / "qwenquant-manifest.json").read_text()),
    }


@pytest.fixture(scope="module")
def arts(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("hprec")
    source = reference_model.build_reference_checkpoint(root / "source")
    return {
        "source": source,
        "default": _quantize(source, root / "default"),
        "fp32": _quantize(source, root / "fp32", "--hessian-precision", "fp32"),
    }


@pytest.mark.parametrize(("which", "precision"), [("default", "tensor-core"), ("fp32", "fp32")])
def test_the_precision_is_recorded_in_the_manifest(arts: dict, which: str, precision: str) -> None:
    m = arts[which]["manifest"]
    assert m["recipe"]["quantization"]["hessian_precision"] == precision
    gptq = m["stages"]["gptq"]
    assert gptq["inputs"]["hessian_precision"] == precision
    assert gptq["params"]["quantization"]["hessian_precision"] == precision
    assert qq("verify", str(arts[which]["out"])).returncode == 0


def test_the_default_is_within_the_documented_tolerance_of_fp32(arts: dict) -> None:
    """Another summation order of the same Hessians: some codes move (so the two paths really
    differ), within the tolerance docs/distributed-gptq.md states for such a difference."""
    from benchmarks.artifact_compare import compare_artifacts

    diff = compare_artifacts(arts["fp32"]["out"], arts["default"]["out"], arts["source"])
    print(
        f"tensor-core vs fp32 Hessians: {diff.codes_fraction:.3%} of codes differ (layer 0: "
        f"{diff.first_layer_fraction:.3%}), at most {diff.max_steps} steps, weight errors within "
        f"{diff.worst_error_ratio():.3%}"
    )
    assert diff.codes_differing > 0, "the two Hessian precisions gave the same codes: the option did nothing"
    assert diff.first_layer_codes[1] > 0 and len(diff.weight_errors) == len(diff.modules)
    assert diff.problems() == [], diff.to_dict()
    assert arts["fp32"]["result"]["root_digest"] != arts["default"]["result"]["root_digest"]


def test_a_changed_precision_reruns_gptq_and_the_plan_says_why(arts: dict) -> None:
    src, out = arts["source"], arts["fp32"]["out"]
    base = (
        "quantize",
        str(src),
        "--recipe",
        "tiny-reference",
        "--source-unverified",
        "--out",
        str(out),
        "--device",
        "cpu",
        "--plan",
        "--json",
    )
    same = json.loads(qq(*base, "--hessian-precision", "fp32").stdout)
    assert same["would_run"] == []
    plan = qq(*base)  # the default: tensor-core
    assert plan.returncode == 0, plan.stderr[-2000:]
    stages = {s["stage"]: s for s in json.loads(plan.stdout)["stages"]}
    assert stages["gptq"]["action"] == "run"
    assert "hessian_precision" in stages["gptq"]["reason"], stages["gptq"]
    assert all(s["action"] == "reuse" for name, s in stages.items() if name in ("source", "calibration"))


def test_an_unknown_precision_is_a_usage_error() -> None:
    proc = qq("quantize", "nowhere", "--out", "nowhere-art", "--hessian-precision", "tf32")
    assert proc.returncode == 2
    assert "--hessian-precision" in proc.stderr and "tf32" in proc.stderr
