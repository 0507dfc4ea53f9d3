"""`qwenquant bench compare --serve ...` with the real vLLM (CPU build) serving the tiny artifact:
MTP on against MTP off, one server per configuration, rounds interleaved.

The `constant` tiny model's MTP head always agrees with the target, so every drafted token is
accepted: the acceptance per position must be exactly 1.0 with MTP on, and nothing is drafted
with it off. Greedy only (temperature > 0 under speculative decoding is wrong on vLLM's CPU
backend, docs/known-issues.md#cpu-spec-sampling).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import LAUNCHER, quantize_tiny_artifact, require_vllm, vllm_env

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
FIGURES = ("wall_tok_s", "decode_tok_s", "ttft_s", "prefill_tok_s")


def test_bench_compare_mtp_on_off(tmp_path: Path) -> None:
    require_vllm(LAUNCHER, ".venv-vllm")
    artifact = quantize_tiny_artifact(tmp_path, "constant", "text-only")
    out = tmp_path / "bench.json"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "qwenquant",
            "bench",
            "compare",
            "--serve",
            str(artifact),
            "--vllm",
            str(LAUNCHER),
            "--profile",
            "single-user",
            "--label-a",
            "mtp-on",
            "--label-b",
            "mtp-off",
            "--vllm-arg-b=--speculative-config",
            "--vllm-arg-b=null",
            "--prompts",
            "quote",
            "--sampling",
            "greedy",
            "--max-tokens",
            "16",
            "--repeats",
            "2",
            "--rounds",
            "2",
            "--max-concurrency",
            "2",
            "--out",
            str(out),
            "--",
            "--max-model-len",
            "2048",
            "--max-num-seqs",
            "2",
        ],  # the ladder's top runs at once
        env=vllm_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert r.returncode == 0, r.stderr[-4000:]
    report = json.loads(out.read_text())
    by = {t["label"]: t for t in report["targets"]}
    assert set(by) == {"mtp-on", "mtp-off"}
    for t in by.values():
        assert (
            t["artifact_root_digest"] == json.loads((artifact / "qwenquant-manifest.json").read_text())["root_digest"]
        )
        assert t["vllm_version"] and t["command"]
        assert t["thinking"] == "the artifact's chat template reads enable_thinking"
        assert sorted(t["cells"]) == [
            "quote/greedy/think-off/c1",
            "quote/greedy/think-off/c2",
            "quote/greedy/think-on/c1",
        ]
        for cell in t["cells"].values():
            assert cell["requests"] == (4 if cell["concurrency"] == 1 else 8)
            assert all(cell["figures"][k]["median"] > 0 for k in FIGURES), cell["figures"]
            assert cell["completion_tokens"] == 16 * cell["requests"]  # ignore_eos honoured: fixed length
        assert [s["concurrency"] for s in t["ladder"]] == [1, 2]
    assert by["mtp-on"]["acceptance"]["per_position"] == [1.0, 1.0, 1.0]
    assert by["mtp-on"]["acceptance"]["mean_acceptance_length"] == 4.0
    assert by["mtp-off"]["acceptance"]["speculative"] is False
    ratios = report["compare"]["cells"]["quote/greedy/think-off/c1"]
    assert report["compare"]["a"] == "mtp-on" and all(ratios[k]["n"] == 2 for k in FIGURES)
    assert report["argv"][:2] == ["qwenquant", "bench"] and "gpu" in report
    assert report["png_path"] and Path(report["png_path"]).read_bytes()[:4] == b"\x89PNG"
    for t in by.values():  # which field the tiny model's first text came in, for the record
        print(t["label"], {k: c["first_text_field"] for k, c in t["cells"].items()})
    print(r.stdout)
