"""The pure parts of the stages: the source description, GPTQ restore, the lm_head config and split."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def _model_spec():
    from qwenquant.recipe import ModelSpec

    return ModelSpec(architectures=["Qwen3_5ForConditionalGeneration"], model_types=["qwen3_5"])


def _fetched(tmp_path: Path) -> Path:
    import hashlib

    src = tmp_path / "src"
    src.mkdir()
    from qwenquant.quantize.stages.source import TEXT_SIZES

    (src / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["Qwen3_5ForConditionalGeneration"],
                "model_type": "qwen3_5",
                "text_config": dict.fromkeys(TEXT_SIZES, 4),
            }
        )
    )
    header = json.dumps({"w": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}}).encode()
    (src / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + b"\x00\x01\x02\x03")
    (src / "tokenizer.json").write_text("{}")
    files = [
        {"path": p.name, "size": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
        for p in sorted(src.iterdir())
    ]
    (src / "qwenquant-fetch.json").write_text(
        json.dumps(
            {
                "schema_version": 1,
                "repo_id": "Qwen/Qwen3.8-27B",
                "repo_type": "model",
                "revision": "main",
                "commit": "a" * 40,
                "files": files,
            }
        )
    )
    return src


def test_source_verified_against_fetch_record(tmp_path: Path) -> None:
    from qwenquant.quantize.stages.source import describe_source

    desc = describe_source(_fetched(tmp_path), _model_spec(), "w4a16-int4head", unverified=False)
    assert desc["kind"] == "fetched" and desc["verified"] is True
    assert desc["repo"] == "Qwen/Qwen3.8-27B" and desc["commit"] == "a" * 40
    assert set(desc["files"]) == {"config.json", "model.safetensors", "tokenizer.json"}


def test_source_that_drifted_from_its_record_is_refused(tmp_path: Path) -> None:
    from qwenquant.errors import VerificationError
    from qwenquant.quantize.stages.source import describe_source

    src = _fetched(tmp_path)
    (src / "model.safetensors").write_bytes(b"WEIGHTS")
    with pytest.raises(VerificationError) as e:
        describe_source(src, _model_spec(), "w4a16-int4head", unverified=False)
    assert "model.safetensors" in e.value.message and "--source-unverified" in (e.value.hint or "")


def test_unverified_source_is_hashed_and_marked(tmp_path: Path) -> None:
    from qwenquant.quantize.stages.source import describe_source

    src = _fetched(tmp_path)
    (src / "qwenquant-fetch.json").unlink()
    desc = describe_source(src, _model_spec(), "w4a16-int4head", unverified=True)
    assert desc["kind"] == "local-unverified" and desc["verified"] is False and desc["commit"] is None
    assert len(desc["files"]["model.safetensors"]["sha256"]) == 64


def test_wrong_model_type_is_refused(tmp_path: Path) -> None:
    from qwenquant.errors import StageError
    from qwenquant.quantize.stages.source import describe_source

    src = _fetched(tmp_path)
    (src / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    with pytest.raises(StageError, match="not what recipe"):
        describe_source(src, _model_spec(), "w4a16-int4head", unverified=True)


# --- pure helpers of the gptq and lm_head stages -------------------------------------------------


def test_restore_plan_takes_unquantized_tensors_from_the_source(tmp_path: Path) -> None:
    from qwenquant.checkpoint.tensorfile import TensorRef
    from qwenquant.quantize.stages.gptq import restore_plan

    def ref(name: str, where: str) -> TensorRef:
        return TensorRef(name, tmp_path / where, "BF16", (2,), 0, 4)

    saved = {
        n: ref(n, "saved")
        for n in ("a.norm.weight", "a.proj.weight_packed", "a.proj.weight_scale", "mtp.fc.weight", "lm_head.weight")
    }
    source = {n: ref(n, "source") for n in ("a.norm.weight", "a.proj.weight", "mtp.fc.weight", "lm_head.weight")}
    plan = restore_plan(saved, source)
    assert plan["a.norm.weight"].path.name == "source" and plan["lm_head.weight"].path.name == "source"
    assert plan["a.proj.weight_packed"].path.name == "saved"
    assert "mtp.fc.weight" not in plan


def test_quantized_config_uses_recipe_patterns() -> None:
    from qwenquant.quantize.stages.gptq import quantized_config

    src = {"model_type": "qwen3_5", "text_config": {"x": 1}}
    saved = {"quantization_config": {"config_groups": {"group_0": {}}, "ignore": ["model.visual.blocks.0.attn.qkv"]}}
    out = quantized_config(src, saved, ["lm_head", "re:.*visual.*"])
    assert out["quantization_config"]["ignore"] == ["lm_head", "re:.*visual.*", "re:^mtp.*"]
    assert out["text_config"] == {"x": 1} and "quantization_config" not in src


def test_head_config_group_added_and_head_unignored() -> None:
    from qwenquant.quantize.stages.lm_head import head_quant_config

    cfg = {
        "quantization_config": {
            "config_groups": {"group_0": {"targets": ["Linear"]}},
            "ignore": ["lm_head", "re:^mtp.*"],
        }
    }
    out = head_quant_config(cfg, {"targets": ["re:.*lm_head$"]})
    qc = out["quantization_config"]
    assert qc["config_groups"]["group_1"] == {"targets": ["re:.*lm_head$"]}
    assert qc["ignore"] == ["re:^mtp.*"]
    assert head_quant_config(out, {"targets": ["re:.*lm_head$"]}) == out  # idempotent
    assert cfg["quantization_config"]["ignore"] == ["lm_head", "re:^mtp.*"]


def test_split_heldout() -> None:
    from qwenquant.quantize.stages.lm_head import split_heldout

    assert split_heldout(32, 0.1) == (list(range(29)), [29, 30, 31])
    assert split_heldout(5, 0.0) == (list(range(5)), [])
    assert split_heldout(2, 0.4) == ([0], [1])


def test_gptq_engine_is_chosen_by_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from qwenquant.errors import UsageError
    from qwenquant.quantize.stages.gptq import gptq_engine

    monkeypatch.delenv("QWENQUANT_GPTQ_ENGINE", raising=False)
    assert gptq_engine() == "streamed"
    monkeypatch.setenv("QWENQUANT_GPTQ_ENGINE", "oneshot")
    assert gptq_engine() == "oneshot"
    monkeypatch.setenv("QWENQUANT_GPTQ_ENGINE", "fast")
    with pytest.raises(UsageError, match="streamed or oneshot, got 'fast'") as e:
        gptq_engine()
    assert e.value.exit_code == 2 and "unset QWENQUANT_GPTQ_ENGINE" in e.value.hint


@pytest.mark.parametrize("raw, cap", [("", None), ("23.5", 23.5), (" 12 ", 12.0)])
def test_gpu_memory_cap_from_environment(monkeypatch: pytest.MonkeyPatch, raw: str, cap: float | None) -> None:
    from qwenquant.quantize.engine.build import max_gpu_mem_gib

    monkeypatch.setenv("QWENQUANT_MAX_GPU_MEM", raw)
    assert max_gpu_mem_gib() == cap


@pytest.mark.parametrize("raw", ["24GiB", "0", "-3"])
def test_a_bad_gpu_memory_cap_is_refused(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    from qwenquant.errors import UsageError
    from qwenquant.quantize.engine.build import max_gpu_mem_gib

    monkeypatch.setenv("QWENQUANT_MAX_GPU_MEM", raw)
    with pytest.raises(UsageError, match=f"QWENQUANT_MAX_GPU_MEM must be a number > 0, got '{raw}'"):
        max_gpu_mem_gib()


def test_streamed_shard_names_put_the_layers_first() -> None:
    from qwenquant.quantize.engine.build import shard_names

    assert shard_names(2, 1) == [
        "model-00001-of-00003.safetensors",
        "model-00002-of-00003.safetensors",
        "model-00003-of-00003.safetensors",
    ]


def test_a_work_folder_with_streamed_layer_records_is_a_work_folder(tmp_path: Path) -> None:
    """A quantize killed mid-gptq leaves gptq-layers/ for the re-run to resume from: not foreign."""
    from qwenquant.outfolder import foreign_in_work

    for name in ("gptq-layers", "gptq", "calibration", ".gptq.abc.partial"):
        (tmp_path / name).mkdir()
    (tmp_path / "gptq.record.json").write_text("{}")
    assert foreign_in_work(tmp_path) == []
    (tmp_path / "gptq-layers-old").mkdir()
    assert foreign_in_work(tmp_path) == [tmp_path / "gptq-layers-old"]
