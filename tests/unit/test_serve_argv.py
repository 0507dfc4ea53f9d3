"""The vLLM command line for each profile and device (exact lists), overrides, and key masking."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qwenquant.errors import ServeError
from qwenquant.recipe import load_recipe
from qwenquant.serve.argv import apply_extra, build_vllm_argv, build_vllm_env, format_command, mask_argv

ART = "/srv/artifacts/q27b"


@pytest.fixture(scope="module")
def recipe():
    return load_recipe("w4a16-int4head")


def manifest(recipe, layout="text-only"):
    rec = recipe.canonical()
    rec["artifact"]["layout"] = layout
    return {"recipe": rec}


COMMON = ["--model", ART, "--served-model-name", "qwen3.8-27b-w4a16", "--host", "127.0.0.1", "--port", "8000"]
MTP = '{"method":"mtp","num_speculative_tokens":3}'
TOOLS = ["--enable-auto-tool-choice", "--tool-call-parser", "qwen3_coder"]  # no vLLM to ask: no strict level


def test_single_user_cuda(recipe):
    argv = build_vllm_argv(ART, recipe.profile("single-user"), manifest(recipe), "cuda")
    assert argv == COMMON + [
        "--max-model-len",
        "32768",
        "--max-num-seqs",
        "1",
        "--max-num-batched-tokens",
        "2048",
        "--gpu-memory-utilization",
        "0.92",
        "--kv-cache-dtype",
        "auto",
        "--mamba-ssm-cache-dtype",
        "float16",
        "--mamba-cache-mode",
        "align",
        "--reasoning-parser",
        "qwen3",
        *TOOLS,
        "--speculative-config",
        MTP,
    ]


def test_batch_cuda(recipe):
    argv = build_vllm_argv(ART, recipe.profile("batch"), manifest(recipe), "cuda")
    assert argv == COMMON + [
        "--max-model-len",
        "4096",
        "--max-num-seqs",
        "16",
        "--max-num-batched-tokens",
        "1024",
        "--gpu-memory-utilization",
        "0.95",
        "--kv-cache-dtype",
        "fp8",
        "--mamba-ssm-cache-dtype",
        "float16",
        "--mamba-cache-mode",
        "align",
        "--reasoning-parser",
        "qwen3",
        *TOOLS,
    ]


def test_single_user_cpu(recipe):
    """CPU: eager, no GPU utilization; MTP turns prefix caching off, so no mamba cache mode either."""
    argv = build_vllm_argv(ART, recipe.profile("single-user"), manifest(recipe), "cpu")
    assert argv == COMMON + [
        "--max-model-len",
        "32768",
        "--max-num-seqs",
        "1",
        "--max-num-batched-tokens",
        "2048",
        "--kv-cache-dtype",
        "auto",
        "--mamba-ssm-cache-dtype",
        "float16",
        "--reasoning-parser",
        "qwen3",
        *TOOLS,
        "--speculative-config",
        MTP,
        "--enforce-eager",
        "--no-enable-prefix-caching",
    ]


def test_batch_cpu(recipe):
    argv = build_vllm_argv(ART, recipe.profile("batch"), manifest(recipe), "cpu")
    assert argv == COMMON + [
        "--max-model-len",
        "4096",
        "--max-num-seqs",
        "16",
        "--max-num-batched-tokens",
        "1024",
        "--kv-cache-dtype",
        "fp8",
        "--mamba-ssm-cache-dtype",
        "float16",
        "--mamba-cache-mode",
        "align",
        "--reasoning-parser",
        "qwen3",
        *TOOLS,
        "--enforce-eager",
    ]


def test_tool_calling_follows_what_the_vllm_offers(recipe):
    """The parser where the vLLM has it, the strict level where it has the flag (probed, else by version)."""
    from qwenquant.serve.argv import tool_flags
    from qwenquant.serve.discover import Frontend

    prof = recipe.profile("single-user")
    probed = Frontend("0.32.0", ("hermes", "qwen3_coder"), ("--tool-call-parser", "--tool-strict-level"))
    argv = build_vllm_argv(ART, prof, manifest(recipe), "cuda", frontend=probed)
    assert argv[argv.index("--enable-auto-tool-choice") :][:5] == [*TOOLS, "--tool-strict-level", "parameter"]
    assert tool_flags(prof, Frontend("0.26.0", None, None)) == (
        TOOLS,
        ["vLLM 0.26.0 has no --tool-strict-level (added in 0.31): tool arguments are not pinned to their schema"],
    )
    assert tool_flags(prof, Frontend("0.31.0", None, None))[0] == [*TOOLS, "--tool-strict-level", "parameter"]
    flags, notes = tool_flags(prof, Frontend("0.26.0", ("hermes",), ("--tool-call-parser",)))
    assert flags == [] and notes == [
        "vLLM 0.26.0 has no tool-call parser 'qwen3_coder': tool calls come back as "
        "plain text (no --enable-auto-tool-choice)"
    ]
    off = prof.model_copy(update={"tool_call_parser": None})
    assert "--enable-auto-tool-choice" not in build_vllm_argv(ART, off, manifest(recipe), "cuda", frontend=probed)


def test_multimodal_layout_serves_language_model_only(recipe):
    argv = build_vllm_argv(ART, recipe.profile("batch"), manifest(recipe, "multimodal"), "cuda")
    assert argv[-1] == "--language-model-only"


def test_profiles_differ_where_they_should(recipe):
    single = build_vllm_argv(ART, recipe.profile("single-user"), manifest(recipe), "cuda")
    batch = build_vllm_argv(ART, recipe.profile("batch"), manifest(recipe), "cuda")
    assert "--speculative-config" in single and "--speculative-config" not in batch


def test_extra_flags_replace_profile_flags(recipe):
    argv = build_vllm_argv(
        ART,
        recipe.profile("single-user"),
        manifest(recipe),
        "cuda",
        ["--max-model-len", "8192", "--gdn-prefill-backend=triton"],
    )
    assert argv.count("--max-model-len") == 1
    assert argv[-3:] == ["--max-model-len", "8192", "--gdn-prefill-backend=triton"]


def test_extra_overrides_reach_the_plan(recipe):
    p = apply_extra(recipe.profile("single-user"), ["--max-model-len=8192", "--max-num-seqs", "2"])
    assert (p.max_model_len, p.max_num_seqs) == (8192, 2)
    with pytest.raises(ServeError, match="--max-num-seqs"):
        apply_extra(recipe.profile("single-user"), ["--max-num-seqs", "many"])


def test_api_key_is_passed_but_masked(recipe):
    argv = build_vllm_argv(ART, recipe.profile("batch"), manifest(recipe), "cuda", api_key="s3cret")
    assert argv[-2:] == ["--api-key", "s3cret"]
    assert mask_argv(argv)[-2:] == ["--api-key", "****"]
    assert mask_argv(["--api-key=s3cret"]) == ["--api-key=****"]
    shown = format_command(["vllm", "serve", *argv], {"VLLM_CPU_KVCACHE_SPACE": "1"})
    assert "s3cret" not in shown and shown.startswith("VLLM_CPU_KVCACHE_SPACE=1 vllm serve --model")


def test_cpu_env(recipe):
    assert build_vllm_env("cpu", {}) == {"VLLM_CPU_KVCACHE_SPACE": "1"}
    assert build_vllm_env("cpu", {"VLLM_CPU_KVCACHE_SPACE": "4"}) == {}
    assert build_vllm_env("cuda", {}) == {}


def test_exactly_one_profile(tmp_path):
    """single-user and batch are mutually exclusive (no --profile means single-user)."""
    from qwenquant.errors import UsageError
    from qwenquant.serve.request import ServeRequest

    with pytest.raises(UsageError, match="choose one --profile \\(got single-user, batch") as e:
        ServeRequest.from_options(tmp_path, ["single-user", "batch"], [], dry_run=True)
    assert e.value.exit_code == 2
    assert ServeRequest.from_options(tmp_path, [], []).profile_name == "single-user"


def test_unknown_device(recipe):
    with pytest.raises(ServeError, match="unknown device"):
        build_vllm_argv(ART, recipe.profile("batch"), manifest(recipe), "tpu")


# --- finding vLLM and the GPU (the thin helpers around the argv) ---------------------------------


def test_no_vllm_says_what_to_install(monkeypatch, tmp_path):
    from qwenquant.serve import discover

    monkeypatch.setattr(discover, "repo_root", lambda: tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("QWENQUANT_VLLM", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ServeError) as e:
        discover.find_vllm(None)
    assert "no vLLM installation found" in e.value.message
    assert "scripts/install-vllm.sh" in e.value.hint and "pip install vllm==" in e.value.hint


def test_launcher_json(tmp_path):
    import json

    from qwenquant.serve.discover import find_vllm

    j = tmp_path / "qwenquant-vllm.json"
    j.write_text(
        json.dumps(
            {
                "python": "/x/python",
                "entrypoint": ["/x/python", "-m", "vllm.entrypoints.openai.api_server"],
                "vllm_version": "0.32.0",
                "device": "cpu",
            }
        )
    )
    inst = find_vllm(str(j))
    assert (inst.version, inst.device, inst.python) == ("0.32.0", "cpu", "/x/python")
    assert inst.command(["--model", "m"]) == ["/x/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"]


@pytest.mark.parametrize(
    "version, ok", [("0.32.0", True), ("0.33.0.dev5+gabc123", True), ("0.26.0", True), ("0.25.2", False)]
)
def test_version_check(version, ok):
    from qwenquant.serve.discover import check_version

    assert (check_version(version, [">=0.26.0"]) is None) == ok


def test_architecture_check_points_at_the_multimodal_layout():
    from qwenquant.serve.discover import VllmInstall, check_architecture

    inst = VllmInstall(("vllm", "serve"), "/x/python", "0.26.0", "cuda", "PATH")
    assert check_architecture("Qwen3_5ForCausalLM", ["Qwen3_5ForCausalLM"], inst) is None
    assert check_architecture("Qwen3_5ForCausalLM", None, inst) is None  # cannot ask: do not block
    msg = check_architecture("Qwen3_5ForCausalLM", ["Qwen3_5ForConditionalGeneration"], inst)
    assert "does not support the artifact's architecture Qwen3_5ForCausalLM" in msg
    assert "layout: multimodal" in msg and "--language-model-only" in msg


def test_gpu_memory_from_nvidia_smi(monkeypatch, tmp_path):
    """STAND-IN nvidia-smi (no GPU here): a script printing two GPUs' memory rows."""
    from qwenquant.serve.machine import read_machine

    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '0, GPU-a, 24576, 23000, 8.6'\necho '1, GPU-b, 24576, 1000, 8.6'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    machine = read_machine("cuda", None, {}, link=False)
    assert (machine.used(1)[0].total, machine.used(1)[0].free) == (24576 * 2**20, 23000 * 2**20)
    assert machine.capability == (8, 6)
    # nvidia-smi lists every GPU; vLLM uses the first one CUDA_VISIBLE_DEVICES exposes
    machine = read_machine("cuda", None, {"CUDA_VISIBLE_DEVICES": "GPU-b"}, link=False)
    assert (machine.used(1)[0].total, machine.used(1)[0].free) == (24576 * 2**20, 1000 * 2**20)


@pytest.mark.parametrize("cap, added", [((9, 0), True), ((8, 6), False)])
def test_sm90_gets_triton_gdn_prefill(cap, added):
    from qwenquant.serve.guards import device_extra

    warnings: list[str] = []
    out = device_extra("cuda", ["--max-model-len", "8192"], cap, warnings)
    assert (out[-2:] == ["--gdn-prefill-backend", "triton"]) == added and bool(warnings) == added
    assert device_extra("cuda", ["--gdn-prefill-backend=flashinfer"], (9, 0), []) == [
        "--gdn-prefill-backend=flashinfer"
    ]
    assert device_extra("cpu", [], (9, 0), []) == []


def test_served_name_is_the_folder_name_except_for_the_real_27b(tmp_path):
    """The recipe's name (qwen3.8-27b-w4a16) names only the 27B; any other artifact is served as its folder."""
    from qwenquant.serve.preflight import served_name
    from qwenquant.testbed.tiny.config import model_config

    real = json.loads((Path(__file__).resolve().parents[2] / "src/qwenquant/data/qwen3_8-27b.config.json").read_text())
    assert served_name(tmp_path / "my-q27b", real, "qwen3.8-27b-w4a16") == "qwen3.8-27b-w4a16"
    assert served_name(tmp_path / "Qwen3.5-tiny-w4a16", model_config(), "qwen3.8-27b-w4a16") == "Qwen3.5-tiny-w4a16"


def test_serve_refuses_an_int4_mtp_artifact_on_a_vllm_not_known_to_load_it():
    """The int4-MTP variant on a vLLM below the version table (0.25): refused before launch, the hint naming
    vLLM #53387 (a bf16 MTP recipe is not held to that range)."""
    from qwenquant.serve.discover import VllmInstall
    from qwenquant.serve.preflight import _check_install

    inst = VllmInstall(("vllm", "serve"), "/x/python", "0.25.1", "cuda", "PATH")
    with pytest.raises(ServeError) as ei:
        _check_install(inst, load_recipe("w4a16-int4head-int4mtp"), {"architectures": ["Qwen3_5ForCausalLM"]})
    assert "vLLM 0.25.1 is not known to load a quantized MTP head" in ei.value.message
    assert "#53387" in ei.value.hint and "0.26-0.34" in ei.value.hint
