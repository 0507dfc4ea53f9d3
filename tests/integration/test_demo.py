"""`qwenquant demo` (what `make demo` runs): tiny checkpoint -> loopback Hub -> fetch -> quantize ->
verify, through the real CLI. Serving is covered by test_serve_vllm.py; here `--no-serve`."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_demo_fetches_quantizes_and_verifies(tmp_path: Path) -> None:
    env = dict(os.environ, QWENQUANT_NO_PROGRESS="1")
    proc = subprocess.run(
        [sys.executable, "-m", "qwenquant", "demo", "--work", str(tmp_path), "--no-serve"],
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = dict(line.split(":", 1) for line in proc.stdout.splitlines() if ":" in line)
    commit = out["commit"].strip()
    artifact = Path(out["artifact"].strip())
    digest = out["root digest"].strip()
    assert re.fullmatch(r"[0-9a-f]{40}", commit)
    # what was fetched is pinned to the printed commit, and every file in it verified
    record = json.loads((tmp_path / "models" / "Qwen3.5-tiny" / "qwenquant-fetch.json").read_text())
    assert record["commit"] == commit
    manifest = json.loads((artifact / "qwenquant-manifest.json").read_text())
    assert manifest["root_digest"] == digest
    assert manifest["source"]["commit"] == commit
    assert "gptq" in out["lm_head KL vs bf16"] and "rtn" in out["lm_head KL vs bf16"]
    # the reference model's recipe ran the quick eval: its figures are in the manifest and printed
    quick = manifest["quality"]["eval"]
    assert manifest["recipe"]["name"] == "tiny-reference" and quick["windows"] == 32
    assert f"perplexity {quick['arms']['artifact']['delta_pct']:+.2f}%" in out["quick eval"]
    assert out["serve"].strip().startswith("skipped")
    assert out["model"].strip() == "the trained tiny reference (Python stdlib code; expect code-like text)"
    # then what to do next: this artifact served and queried, then the real model
    dry_run = proc.stdout.index("dry run: would publish")
    steps_block = proc.stdout[proc.stdout.index("next steps:") : dry_run].rstrip("\n").splitlines()
    assert f"  the artifact is in {artifact} (`qwenquant verify {artifact}` re-checks it;" in steps_block
    assert f"    qwenquant serve {artifact} -- --max-model-len 2048" in steps_block
    assert any(
        s.startswith("    curl -s http://127.0.0.1:8000/v1/completions ") and '"model": "Qwen3.5-tiny-w4a16"' in s
        for s in steps_block
    )
    assert steps_block[-3:] == [
        "    qwenquant fetch Qwen/Qwen3.8-27B --revision main --out models/Qwen3.8-27B",
        "    qwenquant quantize models/Qwen3.8-27B --recipe w4a16-int4head --out artifacts/qwen3.8-27b-w4a16",
        "    qwenquant serve artifacts/qwen3.8-27b-w4a16 --profile single-user",
    ]
    # the CLI steps a user would type are echoed, in order; it ends on a publish dry run (no network)
    steps = [line.split()[2] for line in proc.stderr.splitlines() if line.startswith("$ qwenquant ")]
    assert steps == ["fetch", "quantize", "verify", "publish"]
    assert f"dry run: would publish {artifact} to qwenquant-demo/Qwen3.5-tiny-w4a16@main" in proc.stdout
    assert "  | base_model_relation: quantized" in proc.stdout[dry_run:].splitlines()
    # a second run over the same folder reuses what verified and ends on the same digest; --json says
    # the same as data (stdout holds that one JSON document, the publish dry run's result inside it)
    again = subprocess.run(
        [sys.executable, "-m", "qwenquant", "demo", "--work", str(tmp_path), "--no-serve", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert again.returncode == 0, again.stderr[-4000:]
    result = json.loads(again.stdout)
    assert (result["root_digest"], result["commit"], result["artifact"]) == (digest, commit, str(artifact))
    assert result["served"] is False and result["skipped_serve_reason"] == "--no-serve"
    assert result["quality"]["eval"]["windows"] == 32 and isinstance(result["publish_dry_run"], dict)
