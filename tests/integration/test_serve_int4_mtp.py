"""The int4 MTP head (`mtp: {quantize: gptq}`) on the trained tiny reference, served by the real vLLM
CPU build from .venv-vllm: the artifact holds every MTP Linear packed under the body's config group,
`qwenquant check` passes it, vLLM loads the drafter quantized (packed tensors under a layer built bf16
would be refused at load, vLLM #53387) and its acceptance does not collapse: a silently mis-loaded
head drafts at about 0%. One server for the module, greedy (docs/known-issues.md#cpu-spec-sampling).

The offline figures come from the recipe's quick eval, recorded in the manifest: the source's bf16
MTP head and the shipped int4 one on the artifact's own hidden states, the same windows.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from qwenquant.testbed.tiny import reference_model

from helpers import LAUNCHER, ServedCLI, require_vllm, vllm_env

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

MTP_LINEARS = (
    ["mtp.fc"]
    + [f"mtp.layers.0.self_attn.{p}_proj" for p in "qkvo"]
    + [f"mtp.layers.0.mlp.{p}_proj" for p in ("gate", "up", "down")]
)
SHARING = "Sharing target model lm_head weights with the draft model"


def _env(tmp: Path) -> dict[str, str]:
    return dict(vllm_env(tmp), QWENQUANT_THREADS="2")


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require_vllm(LAUNCHER, ".venv-vllm")
    tmp = tmp_path_factory.mktemp("int4mtp")
    src = reference_model.build_reference_checkpoint(tmp / "source")
    art = tmp / "artifact"
    q = subprocess.run(
        [
            sys.executable,
            "-m",
            "qwenquant",
            "quantize",
            str(src),
            "--source-unverified",
            "--recipe",
            "tiny-reference-int4mtp",
            "--out",
            str(art),
            "--device",
            "cpu",
        ],
        env=_env(tmp),
        capture_output=True,
        text=True,
        timeout=2400,
    )
    assert q.returncode == 0, q.stderr[-3000:]
    return art


@pytest.fixture(scope="module")
def server(artifact: Path):
    log = artifact.parent / "server.log"
    args = [
        str(artifact),
        "--profile",
        "single-user",
        "--vllm",
        str(LAUNCHER),
        "--timeout",
        "900",
        "--log-file",
        str(log),
        "--",
        "--max-model-len",
        "2048",
    ]
    with ServedCLI(*args, env=_env(artifact.parent)) as cli:
        yield cli, log


def _quality(artifact: Path) -> dict:
    from qwenquant.manifest import load_manifest

    return load_manifest(artifact).quality["eval"]


def test_artifact_holds_an_int4_mtp_head_that_check_passes(artifact: Path) -> None:
    from qwenquant.checkpoint.tensorfile import checkpoint_refs

    names = set(checkpoint_refs(artifact))
    for mod in MTP_LINEARS:
        assert {f"{mod}.weight_packed", f"{mod}.weight_scale", f"{mod}.weight_shape"} <= names, mod
        assert f"{mod}.weight" not in names
    assert "mtp.pre_fc_norm_hidden.weight" in names and "mtp.layers.0.self_attn.q_norm.weight" in names
    config = json.loads((artifact / "config.json").read_text())
    assert not any("mtp" in e for e in config["quantization_config"]["ignore"])
    r = subprocess.run(
        [sys.executable, "-m", "qwenquant", "check", str(artifact)],
        env=_env(artifact.parent),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_graft_mtp_keeps_the_int4_head(artifact: Path) -> None:
    """graft-mtp on an int4-MTP artifact: nothing to do (the packed Linears are the artifact's, the
    norms the source's), where the bf16 logic would call every packed tensor foreign."""
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "qwenquant",
            "graft-mtp",
            str(artifact),
            "--source",
            str(artifact.parent / "source"),
            "--check-only",
        ],
        env=_env(artifact.parent),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "nothing to graft" in r.stdout


def test_offline_int4_mtp_agreement_stays_within_its_band(artifact: Path) -> None:
    """The quick eval's paired figure: int4 vs bf16 MTP head on the artifact's states, the same windows
    (t interval over 32 windows); bands recorded on CPU (eval_bands.json's `int4_mtp`)."""
    bands = json.loads(Path(__file__).with_name("eval_bands.json").read_text())["int4_mtp"]
    m = _quality(artifact)["mtp"]
    d = m["int4_vs_bf16"]
    lo, hi = d["ci95_points"]
    print(
        f"MTP t+2 agreement: bf16 head {m['artifact_bf16_mtp']['agree']:.4f}, int4 head {m['artifact']['agree']:.4f}, "
        f"{d['delta_points']:+.2f} points [{lo:+.2f}, {hi:+.2f}], same first draft {d['same_draft']:.4f}"
    )
    assert bands["delta_points"][0] <= d["delta_points"] <= bands["delta_points"][1]
    assert lo <= d["delta_points"] <= hi and hi - lo <= bands["ci_width_points_max"]
    assert bands["bf16_agree"][0] <= m["artifact_bf16_mtp"]["agree"] <= bands["bf16_agree"][1]
    assert bands["same_draft"][0] <= d["same_draft"] <= bands["same_draft"][1]


def test_vllm_loads_the_int4_drafter_and_shares_the_head(server) -> None:
    _, log = server
    text = log.read_text()
    assert SHARING in text
    assert "for CompressedTensorsWNA16" in text


def test_served_acceptance_does_not_collapse(server, artifact: Path) -> None:
    """Served greedy acceptance of the first draft position (3 drafts, the tiny reference's gate
    prompts) against the bf16 MTP head's offline t+2 agreement on the same artifact: a mis-loaded
    int4 head accepts about nothing; a working one near the offline rate."""
    cli, _ = server
    r = subprocess.run(
        [sys.executable, "-m", "qwenquant", "eval", "served", cli.url, "--json"],
        env=_env(artifact.parent),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    m = json.loads(r.stdout)["mtp"]
    bf16 = _quality(artifact)["mtp"]["artifact_bf16_mtp"]["agree"]
    bands = json.loads(Path(__file__).with_name("eval_bands.json").read_text())["int4_mtp"]
    first = m["per_position"]["0"]
    print(
        f"served int4 MTP: mean acceptance length {m['mean_acceptance_length']:.3f}, per position "
        f"{m['per_position']}; offline bf16 t+2 agreement {bf16:.4f}"
    )
    assert m["drafts"] > 0
    assert first >= bands["served_first_vs_bf16_min"] * bf16
    assert m["mean_acceptance_length"] >= bands["served_mean_acceptance_min"]
