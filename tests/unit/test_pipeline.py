"""Stage records: a stage is skipped only when its record proves it complete (no torch here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qwenquant.atomic import pretty_json
from qwenquant.stages.records import StageRunner, check_record, record_digest
from qwenquant.stages.identity import TensorDigest, compare_tensors, recipe_quantizes
from qwenquant.stages.tensorfile import RawTensor, header_bytes, plan_shards

INPUTS = {"upstream": "1" * 64}


def _stage(calls: list[int]):
    def fn(d: Path) -> dict:
        calls.append(1)
        (d / "out.bin").write_bytes(b"payload")
        return {"n": 1}
    return fn


def _run(runner: StageRunner, calls: list[int], inputs=INPUTS):
    return runner.run("demo", inputs, {"p": 1}, _stage(calls))


@pytest.fixture
def ran(tmp_path: Path):
    calls: list[int] = []
    runner = StageRunner(tmp_path)
    _run(runner, calls)
    return tmp_path, calls


def test_complete_record_skips(ran) -> None:
    work, calls = ran
    out = _run(StageRunner(work), calls)
    assert calls == [1] and not out.ran
    rec = json.loads((work / "demo.record.json").read_text())
    assert rec["status"] == "complete" and rec["outputs"] == {"out.bin": out.record["outputs"]["out.bin"]}
    assert rec["record_sha256"] == record_digest(rec)


def _rerun_reason(work: Path, calls: list[int], inputs=INPUTS) -> str:
    out = _run(StageRunner(work), calls, inputs)
    assert out.ran and len(calls) == 2
    assert (work / "demo" / "out.bin").read_bytes() == b"payload"
    return out.reason


def test_missing_record_reruns(ran) -> None:
    work, calls = ran
    (work / "demo.record.json").unlink()
    assert "no completion record" in _rerun_reason(work, calls)


def test_truncated_record_reruns(ran) -> None:
    work, calls = ran
    p = work / "demo.record.json"
    p.write_bytes(p.read_bytes()[:40])
    assert "not valid JSON" in _rerun_reason(work, calls)


@pytest.mark.parametrize("field,value", [("outputs", "x"), ("status", "running"), ("inputs", None),
                                         ("record_sha256", 7)])
def test_malformed_record_reruns(ran, field, value) -> None:
    work, calls = ran
    p = work / "demo.record.json"
    rec = json.loads(p.read_text())
    rec[field] = value
    if field != "record_sha256":
        rec["record_sha256"] = record_digest(rec)
    p.write_bytes(pretty_json(rec))
    reason = _rerun_reason(work, calls)
    assert "malformed" in reason or "not a complete record" in reason


def test_wrong_self_hash_reruns(ran) -> None:
    work, calls = ran
    p = work / "demo.record.json"
    rec = json.loads(p.read_text())
    rec["result"] = {"n": 2}  # edited without re-hashing
    p.write_bytes(pretty_json(rec))
    assert "self-hash" in _rerun_reason(work, calls)


def test_stale_inputs_rerun(ran) -> None:
    work, calls = ran
    assert "inputs changed (upstream)" in _rerun_reason(work, calls, {"upstream": "2" * 64})


def test_changed_output_reruns(ran) -> None:
    work, calls = ran
    (work / "demo" / "out.bin").write_bytes(b"tampered")
    assert "outputs changed" in _rerun_reason(work, calls)


def test_added_output_file_reruns(ran) -> None:
    work, calls = ran
    (work / "demo" / "extra.txt").write_text("x")
    assert "outputs changed" in _rerun_reason(work, calls)
    assert not (work / "demo" / "extra.txt").exists()


def test_failed_stage_leaves_no_record_and_no_output(tmp_path: Path) -> None:
    def boom(d: Path) -> dict:
        (d / "half.bin").write_bytes(b"x")
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        StageRunner(tmp_path).run("demo", INPUTS, {}, boom)
    assert not (tmp_path / "demo.record.json").exists()
    assert not (tmp_path / "demo").exists()
    assert not list(tmp_path.glob(".demo.*"))


def test_check_record_rejects_other_stage() -> None:
    body = {"schema_version": 1, "stage": "other", "status": "complete", "inputs": {}, "outputs": {},
            "params": {}, "result": {}, "started": "", "finished": "", "tool_versions": {}}
    body["record_sha256"] = record_digest(body)
    rec, why = check_record(json.dumps(body).encode(), stage="demo", inputs={}, params={}, outputs_on_disk=dict)
    assert rec is None and "not a complete record of this stage" in why


# --- the byte-identity proof and deterministic shard writing -------------------------------------

def _td(tag: str) -> TensorDigest:
    return TensorDigest("BF16", (2,), tag * 64)


def test_identity_proof_accepts_quantized_and_identical() -> None:
    src = {"a.norm.weight": _td("1"), "a.proj.weight": _td("2")}
    art = {"a.norm.weight": _td("1"), "a.proj.weight_packed": _td("3"), "a.proj.weight_scale": _td("4")}
    assert compare_tensors(src, art, rename=lambda n: n, may_quantize=recipe_quantizes([], head_quantized=True)) == []


def test_identity_proof_catches_rounded_norm_and_wrongly_quantized() -> None:
    src = {"a.norm.weight": _td("1"), "x.in_proj_a.weight": _td("2"), "gone.weight": _td("5")}
    art = {"a.norm.weight": _td("9"), "x.in_proj_a.weight_packed": _td("3"), "stray": _td("7")}
    problems = compare_tensors(src, art, rename=lambda n: n,
                               may_quantize=recipe_quantizes(["re:.*in_proj_a$"], head_quantized=True))
    text = "\n".join(problems)
    assert "a.norm.weight: bytes differ" in text
    assert "x.in_proj_a: quantized, but the recipe keeps it" in text
    assert "gone.weight: missing" in text
    assert "stray: in the artifact but not derived" in text


def test_shard_header_is_deterministic_and_aligned() -> None:
    ts = [RawTensor("b", "BF16", (2,), b"\x00" * 4), RawTensor("a", "I32", (1,), b"\x01" * 4)]
    h1, h2 = header_bytes(ts), header_bytes(list(reversed(ts)))
    assert h1 == h2 and (len(h1) - 8) % 8 == 0
    assert plan_shards({t.name: t for t in ts}, 4) == {"model-00001-of-00002.safetensors": ["a"],
                                                       "model-00002-of-00002.safetensors": ["b"]}


# --- the source stage ----------------------------------------------------------------------------

class _Recipe:
    name = "w4a16-int4head"

    class model:  # noqa: N801 (stands in for RecipeModel)
        architectures = ["Qwen3_5ForConditionalGeneration"]
        model_types = ["qwen3_5"]


def _fetched(tmp_path: Path) -> Path:
    import hashlib

    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"architectures": ["Qwen3_5ForConditionalGeneration"],
                                                 "model_type": "qwen3_5"}))
    header = json.dumps({"w": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}}).encode()
    (src / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + b"\x00\x01\x02\x03")
    (src / "tokenizer.json").write_text("{}")
    files = [{"path": p.name, "size": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
             for p in sorted(src.iterdir())]
    (src / "qwenquant-fetch.json").write_text(json.dumps(
        {"schema_version": 1, "repo_id": "Qwen/Qwen3.8-27B", "repo_type": "model", "revision": "main",
         "commit": "a" * 40, "files": files}))
    return src


def test_source_verified_against_fetch_record(tmp_path: Path) -> None:
    from qwenquant.stages.source import describe_source

    desc = describe_source(_fetched(tmp_path), _Recipe, unverified=False)
    assert desc["kind"] == "fetched" and desc["verified"] is True
    assert desc["repo"] == "Qwen/Qwen3.8-27B" and desc["commit"] == "a" * 40
    assert set(desc["files"]) == {"config.json", "model.safetensors", "tokenizer.json"}


def test_source_that_drifted_from_its_record_is_refused(tmp_path: Path) -> None:
    from qwenquant.errors import VerificationError
    from qwenquant.stages.source import describe_source

    src = _fetched(tmp_path)
    (src / "model.safetensors").write_bytes(b"WEIGHTS")
    with pytest.raises(VerificationError) as e:
        describe_source(src, _Recipe, unverified=False)
    assert "model.safetensors" in e.value.message and "--source-unverified" in (e.value.hint or "")


def test_unverified_source_is_hashed_and_marked(tmp_path: Path) -> None:
    from qwenquant.stages.source import describe_source

    src = _fetched(tmp_path)
    (src / "qwenquant-fetch.json").unlink()
    desc = describe_source(src, _Recipe, unverified=True)
    assert desc["kind"] == "local-unverified" and desc["verified"] is False and desc["commit"] is None
    assert len(desc["files"]["model.safetensors"]["sha256"]) == 64


def test_wrong_model_type_is_refused(tmp_path: Path) -> None:
    from qwenquant.errors import StageError
    from qwenquant.stages.source import describe_source

    src = _fetched(tmp_path)
    (src / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    with pytest.raises(StageError, match="not what recipe"):
        describe_source(src, _Recipe, unverified=True)


# --- pure helpers of the gptq and lm_head stages -------------------------------------------------

def test_restore_plan_takes_unquantized_tensors_from_the_source(tmp_path: Path) -> None:
    from qwenquant.stages.gptq import restore_plan
    from qwenquant.stages.tensorfile import TensorRef

    def ref(name: str, where: str) -> TensorRef:
        return TensorRef(name, tmp_path / where, "BF16", (2,), 0, 4)

    saved = {n: ref(n, "saved") for n in ("a.norm.weight", "a.proj.weight_packed", "a.proj.weight_scale",
                                          "mtp.fc.weight", "lm_head.weight")}
    source = {n: ref(n, "source") for n in ("a.norm.weight", "a.proj.weight", "mtp.fc.weight", "lm_head.weight")}
    plan = restore_plan(saved, source)
    assert plan["a.norm.weight"].path.name == "source" and plan["lm_head.weight"].path.name == "source"
    assert plan["a.proj.weight_packed"].path.name == "saved"
    assert "mtp.fc.weight" not in plan


def test_quantized_config_uses_recipe_patterns() -> None:
    from qwenquant.stages.gptq import quantized_config

    src = {"model_type": "qwen3_5", "text_config": {"x": 1}}
    saved = {"quantization_config": {"config_groups": {"group_0": {}}, "ignore": ["model.visual.blocks.0.attn.qkv"]}}
    out = quantized_config(src, saved, ["lm_head", "re:.*visual.*"])
    assert out["quantization_config"]["ignore"] == ["lm_head", "re:.*visual.*", "re:^mtp.*"]
    assert out["text_config"] == {"x": 1} and "quantization_config" not in src


def test_head_config_group_added_and_head_unignored() -> None:
    from qwenquant.stages.headquant import head_quant_config

    cfg = {"quantization_config": {"config_groups": {"group_0": {"targets": ["Linear"]}},
                                   "ignore": ["lm_head", "re:^mtp.*"]}}
    out = head_quant_config(cfg, {"targets": ["re:.*lm_head$"]})
    qc = out["quantization_config"]
    assert qc["config_groups"]["group_1"] == {"targets": ["re:.*lm_head$"]}
    assert qc["ignore"] == ["re:^mtp.*"]
    assert head_quant_config(out, {"targets": ["re:.*lm_head$"]}) == out  # idempotent
    assert cfg["quantization_config"]["ignore"] == ["lm_head", "re:^mtp.*"]


def test_split_heldout() -> None:
    from qwenquant.stages.headquant import split_heldout

    assert split_heldout(32, 0.1) == (list(range(29)), [29, 30, 31])
    assert split_heldout(5, 0.0) == (list(range(5)), [])
    assert split_heldout(2, 0.4) == ([0], [1])
