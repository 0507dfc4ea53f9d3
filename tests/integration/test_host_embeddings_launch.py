"""`serve --host-embeddings` in the launch plan: the switch vLLM gets, the budget that counts the table off the GPU, and
each refusal, on the machine fixtures of the launch tests (tests/integration/machines.py; its docstring names the
stand-ins: a fake nvidia-smi and a stand-in vLLM, since no GPU is here). The plugin's own decisions against vLLM's
functions are tests/integration/test_host_embeddings_plugin.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from machines import dry_run, machine_env, serve_argv
from standin import build_standin_artifact

from helpers import flat

ENV = "QWENQUANT_HOST_EMBEDDINGS"


@pytest.fixture(scope="module")
def artifact(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_standin_artifact(tiny_checkpoint, tmp_path_factory.mktemp("hostemb") / "art")


def _embeddings_bytes(artifact: Path) -> int:
    from qwenquant.plan.artifact import artifact_tensor_bytes
    from qwenquant.plan.weights import model_shape, weights_from_tensors

    shape = model_shape(json.loads((artifact / "config.json").read_text()))
    return weights_from_tensors(artifact_tensor_bytes(artifact, None), shape, 1).bytes["embeddings"]


def test_host_embeddings_switches_the_plugin_on_and_takes_the_table_out_of_the_budget(artifact, tmp_path):
    code, off, err, _ = dry_run(artifact, tmp_path, "one-gpu", "--profile", "single-user")
    assert code == 0 and off is not None, err
    code, on, err, _ = dry_run(artifact, tmp_path, "one-gpu", "--profile", "single-user", "--host-embeddings")
    assert code == 0 and on is not None, err
    assert on["env"][ENV] == "1" and ENV not in off["env"]
    table = _embeddings_bytes(artifact)
    assert table > 0
    assert off["budget"]["weights_bytes"] - on["budget"]["weights_bytes"] == table
    assert on["budget"]["host_bytes"] == table and off["budget"]["host_bytes"] == 0
    assert on["budget"]["cache_available"] - off["budget"]["cache_available"] == table
    assert any("host embeddings" in n for n in on["notes"])
    # the stand-in's launcher records no plugins: serve cannot tell, and says so
    assert any("cannot tell whether this vLLM has qwenquant's host-embeddings plugin" in w for w in on["warnings"])


def test_a_launcher_without_the_plugin_is_refused(artifact, tmp_path):
    env, launcher, _ = machine_env(tmp_path, "one-gpu")
    doc = json.loads(launcher.read_text())
    launcher.write_text(json.dumps(doc | {"plugins": ["qwenquant_cpu_w4a16"]}))
    r = subprocess.run(
        serve_argv(artifact, launcher, "--host-embeddings"),
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert r.returncode == 7, r.stderr
    assert "lacks qwenquant's host-embeddings plugin" in flat(r.stderr)
    assert "scripts/install-vllm.sh" in flat(r.stderr)
    doc["plugins"] = ["qwenquant_host_embeddings"]
    launcher.write_text(json.dumps(doc))
    code, on, err, _ = dry_run(artifact, tmp_path, "one-gpu", "--host-embeddings")  # a fresh launcher: none recorded
    assert code == 0 and on is not None, err


@pytest.mark.parametrize(
    "machine, code, line",
    [
        ("two-gpus-nvlink", 7, "host embeddings over 2 GPUs"),
        ("cpu-avx512", 2, "vLLM's CPU build has no device memory to save"),
    ],
)
def test_host_embeddings_refused_where_they_cannot_work(artifact, tmp_path, machine, code, line):
    got, doc, err, _ = dry_run(artifact, tmp_path, machine, "--host-embeddings")
    assert got == code, err
    assert doc is not None and any(line in f["message"] for f in doc["failures"]), doc and doc["failures"]


def test_an_unread_vllm_release_warns(artifact, tmp_path):
    _, doc, err, _ = dry_run(artifact, tmp_path, "one-gpu", "--host-embeddings", version="0.27.0")
    assert doc is not None, err  # (the stand-in artifact's recipe asks for >=0.28: a failure of its own)
    assert any("were not read in this release" in w for w in doc["warnings"])


def test_the_variable_in_the_shell_is_withheld_unless_asked(artifact, tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, "1")
    code, doc, err, _ = dry_run(artifact, tmp_path, "one-gpu")
    assert code == 0 and doc is not None, err
    assert ENV in doc["env_unset"] and ENV not in doc["env"]
    assert any("--host-embeddings" in w for w in doc["warnings"])


def test_long_context_max_sizes_the_kv_cache_from_the_plan(artifact, tmp_path):
    """The shipped long-context-max profile: the table on the host and vLLM's KV cache the plan's figure
    (--kv-cache-memory-bytes = the budget's cache_available); a figure after -- wins and is passed once."""
    code, doc, err, _ = dry_run(artifact, tmp_path, "one-gpu", "--profile", "long-context-max")
    assert code == 0 and doc is not None, err
    cmd = doc["command"]
    assert cmd.count("--kv-cache-memory-bytes") == 1
    assert int(cmd[cmd.index("--kv-cache-memory-bytes") + 1]) == doc["budget"]["cache_available"] > 0
    assert doc["env"][ENV] == "1" and doc["budget"]["host_bytes"] == _embeddings_bytes(artifact)
    code, doc, err, _ = dry_run(
        artifact, tmp_path, "one-gpu", "--profile", "long-context-max", extra=("--kv-cache-memory-bytes", "1000000000")
    )
    assert code == 0 and doc is not None, err
    cmd = doc["command"]
    assert cmd.count("--kv-cache-memory-bytes") == 1 and cmd[cmd.index("--kv-cache-memory-bytes") + 1] == "1000000000"
    assert any("replaces the profile's kv_cache_from_plan" in n for n in doc["notes"])
