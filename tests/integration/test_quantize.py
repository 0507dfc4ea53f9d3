"""`qwenquant quantize` end to end on the tiny model: real llm-compressor GPTQ on the CPU.

The artifact is built once per module (a subprocess running the real CLI) and many things are
asserted on it; the resume, kill and record-corruption tests reuse its work folder.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from qwenquant import data_path

from helpers import REPO, freeze_inside_gptq, qq, raw_tensors, strip_mtp

pytestmark = pytest.mark.slow

QUANT_SUFFIXES = (".weight_packed", ".weight_scale", ".weight_shape", ".weight_zero_point", ".weight_g_idx")


def quantize_args(source: Path, out: Path, *extra: str) -> list[str]:
    return [
        "quantize",
        str(source),
        "--recipe",
        "w4a16-int4head",
        "--calibration",
        "tiny-demo",
        "--source-unverified",
        "--out",
        str(out),
        "--json",
        *extra,
    ]


@pytest.fixture(scope="module")
def built(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("quantize")
    out = root / "artifact"
    t0 = time.monotonic()
    proc = qq(*quantize_args(tiny_checkpoint, out))
    wall = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {
        "source": tiny_checkpoint,
        "out": out,
        "work": root / "artifact.work",
        "result": json.loads(proc.stdout),
        "stderr": proc.stderr,
        "wall": wall,
        "root": root,
    }


def test_result_and_manifest(built: dict) -> None:
    from qwenquant.manifest import load_manifest, verify_artifact

    res = built["result"]
    assert res["artifact"] == str(built["out"])
    assert re.fullmatch(r"[0-9a-f]{64}", res["root_digest"])
    m = load_manifest(built["out"])
    assert m.root_digest == res["root_digest"]
    assert verify_artifact(built["out"]).ok
    assert m.calibration["fingerprint_sha256"] == res["calibration_fingerprint"]
    assert m.calibration["num_samples"] == 32 and m.calibration["token_total"] > 0
    assert set(m.stages) == {"source", "calibration", "gptq", "lm_head", "mtp", "textonly", "check", "eval"}
    assert m.stages["eval"]["result"] == {"eval": None} and "eval" not in m.quality  # the recipe asks for none
    assert all(r["status"] == "complete" for r in m.stages.values())
    assert {"torch", "transformers", "llmcompressor", "compressed-tensors", "qwenquant"} <= set(m.tool_versions)
    assert m.source["kind"] == "local-unverified" and m.source["files"]
    # the recipe has no eval: --json says so instead of "ran"
    assert res["stages"] == {**{s: "ran" for s in m.stages}, "eval": "not asked"}


def test_json_carries_what_the_run_measured(built: dict) -> None:
    """`--json`'s timings (QuantizeResult.timings, what the benchmarks read): every stage that ran, the
    streamed engine's phases for each decoder layer, the gptq stage's parts after its loop; one process,
    so no per-rank figures."""
    t = built["result"]["timings"]
    layers = json.loads((built["source"] / "config.json").read_text())["text_config"]["num_hidden_layers"]
    assert set(t["stages"]) == set(built["result"]["stages"]) and all(v >= 0 for v in t["stages"].values())
    assert len(t["gptq_layers"]) == layers
    assert [set(p) for p in t["gptq_layers"]] == [
        {"read", "build", "calibrate", "gptq", "write", "rebuild", "forward"}
    ] * layers  # --json sorts the keys
    assert set(t["gptq_tail"]) == {
        "head_calibration",
        "layer_links",
        "rest_shards",
        "index_and_calibration",
        "identity_proof",
    }, t["gptq_tail"]
    assert t["gptq_ranks"] == []


def test_artifact_layout(built: dict) -> None:
    names = sorted(p.name for p in built["out"].iterdir())
    assert "qwenquant-manifest.json" in names and "qwenquant-quality.json" in names
    assert {
        "config.json",
        "model.safetensors.index.json",
        "model-mtp.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    } <= set(names)
    assert not any("preprocessor" in n or "processor_config" in n for n in names)
    tensors = raw_tensors(built["out"])
    assert not any(n.startswith("model.visual.") or n.startswith("model.language_model.") for n in tensors)
    index = json.loads((built["out"] / "model.safetensors.index.json").read_text())["weight_map"]
    assert set(index) == set(tensors)


def test_artifact_files_get_the_usual_modes(built: dict) -> None:
    """Temporary-file helpers create 0600 files; an artifact served by another user must be readable."""
    import os
    import stat

    mask = os.umask(0)
    os.umask(mask)
    want = 0o666 & ~mask
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in built["out"].iterdir()}
    assert modes == {name: want for name in modes}


def test_text_only_config_has_no_mrope(built: dict) -> None:
    cfg = json.loads((built["out"] / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3_5ForCausalLM"] and cfg["model_type"] == "qwen3_5_text"
    assert "mrope" not in json.dumps(cfg)
    assert "vision_config" not in cfg and "text_config" not in cfg
    qc = cfg["quantization_config"]
    assert "re:^mtp.*" in qc["ignore"] and "lm_head" not in qc["ignore"]
    assert any(g["targets"] == ["re:.*lm_head$"] for g in qc["config_groups"].values())


def test_unquantized_tensors_byte_identical_to_source(built: dict) -> None:
    src = raw_tensors(built["source"])
    art = raw_tensors(built["out"])
    quantized = {n.rsplit(".", 1)[0] for n in art if n.endswith(QUANT_SUFFIXES)}
    checked = norms = 0
    for name, (dtype, shape, data) in art.items():
        if name.endswith(QUANT_SUFFIXES):
            continue
        src_name = name if name.startswith(("mtp.", "lm_head")) else "model.language_model." + name[len("model.") :]
        assert src[src_name][:2] == (dtype, shape), name
        assert src[src_name][2] == data, f"{name} differs from the source"
        checked += 1
        norms += "norm" in name
    assert norms >= 10  # the offset norms llm-compressor 0.14 rounds through bf16 (restored)
    assert "lm_head" in quantized and "model.layers.0.mlp.down_proj" in quantized
    assert all(f"mtp.{x}" not in quantized for x in ("fc", "layers.0.mlp.down_proj"))
    assert sum(1 for n in art if n.startswith("mtp.")) == 15
    assert checked > 40


def test_lm_head_gptq_beats_rtn(built: dict) -> None:
    q = json.loads((built["out"] / "qwenquant-quality.json").read_text())["lm_head"]
    assert q["method"] == "gptq" and q["heldout_tokens"] > 0
    assert q["gptq"]["kl"] < q["rtn"]["kl"]
    assert q["kl_reduction_pct"] > 0
    assert built["result"]["quality"] == {"lm_head": q}


def test_lm_head_record_keeps_the_row_chunk_that_ran(built: dict) -> None:
    """The recipe says `row_chunk: auto`; the record and the manifest say what ran (on the CPU: 8192
    rows, or the whole vocabulary when it is smaller), qwenquant-quality.json does not."""
    from qwenquant.manifest import load_manifest

    vocab = json.loads((built["source"] / "config.json").read_text())["text_config"]["vocab_size"]
    record = json.loads((built["work"] / "lm_head.record.json").read_text())
    assert record["params"]["lm_head"]["row_chunk"] == "auto"
    assert record["result"]["row_chunk"] == min(8192, vocab)
    assert load_manifest(built["out"]).stages["lm_head"]["result"]["row_chunk"] == min(8192, vocab)
    assert "row_chunk" not in json.loads((built["out"] / "qwenquant-quality.json").read_text())


def _calibration_ids(source: Path) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(source))
    lines = data_path("calibration", "tiny-demo.jsonl").read_text().splitlines()[-6:]
    return [
        tok(tok.apply_chat_template(json.loads(x)["messages"], tokenize=False), add_special_tokens=False)["input_ids"]
        for x in lines
    ]


def _rtn_fake_quant(model, group: int = 128) -> None:
    """The naive baseline: round-to-nearest int4 of every Linear the recipe quantizes, in place."""
    import torch

    skip = ("visual", "in_proj_a", "in_proj_b", "mtp")
    with torch.no_grad():
        for name, mod in model.named_modules():
            if isinstance(mod, torch.nn.Linear) and not any(s in name for s in skip):
                w = mod.weight.float().unflatten(-1, (-1, group))
                s = w.abs().amax(-1, keepdim=True) / 7.5
                mod.weight.copy_(((w / s).round().clamp(-8, 7) * s).flatten(-2).to(mod.weight.dtype))


def test_loads_in_transformers_with_logits_close_to_source(built: dict) -> None:
    """Tolerance: this tiny model has random weights, where int4 error is large and compounds over
    layers (round-to-nearest int4 of the same Linears is the yardstick, computed here). The
    artifact must load through compressed-tensors decompression and be at least as close to the
    source as that baseline, minus a small margin, and clearly correlated with it (cosine > 0.7)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3_5ForConditionalGeneration

    torch.manual_seed(0)
    art = AutoModelForCausalLM.from_pretrained(str(built["out"]), dtype="auto").eval()
    ref = Qwen3_5ForConditionalGeneration.from_pretrained(str(built["source"]), dtype="auto").eval()
    rtn = Qwen3_5ForConditionalGeneration.from_pretrained(str(built["source"]), dtype="auto").eval()
    _rtn_fake_quant(rtn)
    assert type(art).__name__ == "Qwen3_5ForCausalLM"

    def stats(model) -> tuple[float, float]:
        cos, top1, n = 0.0, 0.0, 0
        with torch.no_grad():
            for ids in _calibration_ids(built["source"]):
                x = torch.tensor([ids])
                a, b = model(input_ids=x).logits.float()[0], ref(input_ids=x).logits.float()[0]
                cos += torch.nn.functional.cosine_similarity(a, b, dim=-1).sum().item()
                top1 += (a.argmax(-1) == b.argmax(-1)).float().sum().item()
                n += len(ids)
        return cos / n, top1 / n

    art_cos, art_top1 = stats(art)
    rtn_cos, rtn_top1 = stats(rtn)
    print(f"artifact cos {art_cos:.4f} top1 {art_top1:.3f}; rtn cos {rtn_cos:.4f} top1 {rtn_top1:.3f}")
    assert art_cos > 0.7
    assert art_cos >= rtn_cos - 0.03
    assert art_top1 >= rtn_top1 - 0.1


def test_rerun_skips_every_stage_with_same_digest(built: dict, tmp_path: Path) -> None:
    proc = qq(*quantize_args(built["source"], built["out"]))
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout)
    assert res["root_digest"] == built["result"]["root_digest"]
    assert res["stages"] == {**{s: "skipped" for s in res["stages"]}, "eval": "not asked"}, res["stages"]


def test_out_holding_user_files_is_refused_then_replaced_with_force(built: dict, tmp_path: Path) -> None:
    out, work = tmp_path / "out", tmp_path / "out.work"
    shutil.copytree(built["work"], work)  # every stage is reused: only the out folder matters here
    out.mkdir()
    (out / "notes.txt").write_bytes(b"my notes\n")
    proc = qq(*quantize_args(built["source"], out))
    assert proc.returncode == 5, proc.stderr[-3000:]
    assert "exists and is not an artifact of recipe 'w4a16-int4head'" in proc.stderr and "--force" in proc.stderr
    assert [p.name for p in out.iterdir()] == ["notes.txt"] and (out / "notes.txt").read_bytes() == b"my notes\n"
    proc = qq(*quantize_args(built["source"], out, "--force"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"--force: removing {out}, which holds 1 file(s), 9 bytes: notes.txt" in proc.stderr
    assert json.loads(proc.stdout)["root_digest"] == built["result"]["root_digest"]
    assert not (out / "notes.txt").exists()
    # the same build again is a resume, not a foreign folder
    assert qq(*quantize_args(built["source"], out)).returncode == 0


# --- graft-mtp ------------------------------------------------------------------------------------


def test_graft_mtp_restores_and_is_idempotent(built: dict, tmp_path: Path) -> None:
    art = Path(shutil.copytree(built["out"], tmp_path / "art"))
    strip_mtp(art)
    kept = {n: t for n, t in raw_tensors(built["out"]).items() if not n.startswith("mtp.")}
    assert raw_tensors(art) == kept  # only the MTP shard and its index entries went
    check = qq("graft-mtp", str(art), "--source", str(built["source"]), "--check-only")
    assert check.returncode != 0 and "MTP head incomplete" in check.stderr

    proc = qq("graft-mtp", str(art), "--source", str(built["source"]))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "grafted: add 15" in proc.stdout
    src = raw_tensors(built["source"])
    got = raw_tensors(art)
    mtp = [n for n in src if n.startswith("mtp.")]
    assert len(mtp) == 15 and all(got[n] == src[n] for n in mtp)
    # the repaired artifact is the original one, file for file
    assert (art / "model-mtp.safetensors").read_bytes() == (built["out"] / "model-mtp.safetensors").read_bytes()
    from qwenquant.manifest import load_manifest, verify_artifact

    assert verify_artifact(art).ok
    assert load_manifest(art).root_digest == built["result"]["root_digest"]

    manifest_before = (art / "qwenquant-manifest.json").read_bytes()
    again = qq("graft-mtp", str(art), "--source", str(built["source"]))
    assert again.returncode == 0 and "nothing to graft" in again.stdout
    assert (art / "qwenquant-manifest.json").read_bytes() == manifest_before
    ok = qq("graft-mtp", str(art), "--source", str(built["source"]), "--check-only")
    assert ok.returncode == 0 and "nothing to graft" in ok.stdout


# --- CLI errors -----------------------------------------------------------------------------------


def test_source_without_fetch_record_is_refused(built: dict, tmp_path: Path) -> None:
    proc = qq("quantize", str(built["source"]), "--calibration", "tiny-demo", "--out", str(tmp_path / "a"))
    assert proc.returncode == 4, proc.stderr[-2000:]
    assert "error:" in proc.stderr and "--source-unverified" in proc.stderr
    assert not (tmp_path / "a").exists() and not (tmp_path / "a.work").exists()


def test_missing_source_folder(tmp_path: Path) -> None:
    proc = qq(*quantize_args(tmp_path / "nope", tmp_path / "a"))
    # the usage rule (README, exit codes): a path argument that does not exist is exit 2 in every command
    assert proc.returncode == 2 and "does not exist" in proc.stderr and not (tmp_path / "a").exists()


def test_bad_device_flag(tmp_path: Path) -> None:
    proc = qq(*quantize_args(tmp_path, tmp_path / "a", "--device", "tpu"))
    assert proc.returncode == 2 and "'tpu' is not one of 'cpu', 'cuda'" in proc.stderr


# --- kill during GPTQ, then resume ----------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT, signal.SIGTERM], ids=["SIGKILL", "Ctrl-C", "SIGTERM"])
def test_killed_during_gptq_then_rerun_gives_same_digest(built: dict, tmp_path: Path, sig: int) -> None:
    """Killed inside the gptq stage, after its first decoder layer is persisted (helpers.freeze_inside_gptq)."""
    out = tmp_path / "killed"
    work = tmp_path / "killed.work"
    env = dict(os.environ, QWENQUANT_THREADS="2", QWENQUANT_NO_PROGRESS="1", PYTHONHASHSEED="0")
    log = open(tmp_path / "first.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "qwenquant", *quantize_args(built["source"], out)],
        stdout=subprocess.DEVNULL,
        stderr=log,
        env=env,
        cwd=REPO,
    )
    try:
        freeze_inside_gptq(proc, work / "gptq-layers" / "layer-00000" / "record.json", tmp_path / "first.log")
        proc.send_signal(sig)
        proc.send_signal(signal.SIGCONT)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    assert (work / "calibration.record.json").exists()
    assert not (work / "gptq.record.json").exists()  # stopped mid-stage: no completion record
    assert not out.exists()
    if sig == signal.SIGKILL:
        assert proc.returncode == -signal.SIGKILL
        assert list(work.glob(".gptq.*.partial"))  # left behind; never trusted, removed by the re-run
    else:  # SIGTERM (`kill PID`) stops it as Ctrl-C does, with the shell's code for a TERM
        assert proc.returncode == (130 if sig == signal.SIGINT else 143)
        assert not list(work.glob(".gptq.*.partial"))  # Ctrl-C cleans its staging folder
    done = len(list((work / "gptq-layers").glob("layer-*/record.json")))
    assert 1 <= done <= 4, done  # persisted layers survive both signals; the re-run resumes after them
    # the resume point, said one way by the Ctrl-C line, the re-run's log (and `--plan`)
    point = (
        (
            f"resumes at decoder layer {done + 1} of 4; {'layer 1 is' if done == 1 else f'layers 1-{done} are'} "
            "recorded and replayed"
        )
        if done < 4
        else "all 4 decoder layers are recorded (replayed, none quantized anew)"
    )
    if sig != signal.SIGKILL:  # Ctrl-C and SIGTERM say what is kept and where the re-run resumes
        said = " ".join((tmp_path / "first.log").read_text().split())
        assert (
            f"interrupted in stage gptq; 2 of 8 stages complete in {work} (source, calibration). Re-run the "
            f"same command to resume from stage gptq: gptq {point}"
        ) in said

    again = qq(*quantize_args(built["source"], out))
    assert again.returncode == 0, again.stderr[-3000:]
    assert "stage calibration: complete, skipped" in again.stderr
    assert "stage gptq: running (no completion record)" in again.stderr
    if done < 4:
        assert f"gptq: {point}; decoder layer {done + 1}: " in again.stderr, again.stderr[-3000:]
    assert not list(work.glob(".*.partial"))
    assert json.loads(again.stdout)["root_digest"] == built["result"]["root_digest"]
    # no timestamps in the artifact: even the manifest is byte-identical to the uninterrupted run's
    assert (out / "qwenquant-manifest.json").read_bytes() == (built["out"] / "qwenquant-manifest.json").read_bytes()


# --- a corrupt or partial record is never trusted -------------------------------------------------


def _rehash(rec: dict) -> dict:
    from qwenquant.quantize.records import record_digest

    rec["record_sha256"] = record_digest(rec)
    return rec


def _missing(p: Path, work: Path) -> None:
    p.unlink()


def _truncated(p: Path, work: Path) -> None:
    p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2])


def _malformed(p: Path, work: Path) -> None:
    rec = json.loads(p.read_text())
    rec["outputs"] = ["config.json"]
    p.write_text(json.dumps(_rehash(rec)))


def _wrong_self_hash(p: Path, work: Path) -> None:
    rec = json.loads(p.read_text())
    rec["result"]["graft"] = "edited"
    p.write_text(json.dumps(rec))


def _stale_input(p: Path, work: Path) -> None:
    rec = json.loads(p.read_text())
    rec["inputs"]["lm_head"] = "0" * 64  # a record left by a run with a different lm_head output
    p.write_text(json.dumps(_rehash(rec)))


def _output_changed(p: Path, work: Path) -> None:
    shard = work / "mtp" / "model-mtp.safetensors"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.unlink()  # a new file: never write through a hard link shared with other stages
    shard.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "corrupt,reason",
    [
        (_missing, "no completion record"),
        (_truncated, "not valid JSON"),
        (_malformed, "malformed"),
        (_wrong_self_hash, "fails its self-hash"),
        (_stale_input, "inputs changed (lm_head)"),
        (_output_changed, "outputs changed on disk (model-mtp.safetensors)"),
    ],
)
def test_untrusted_mtp_record_reruns_the_stage(built: dict, tmp_path: Path, corrupt, reason: str) -> None:
    work = Path(shutil.copytree(built["work"], tmp_path / "a.work", ignore=shutil.ignore_patterns(".lock")))
    record = work / "mtp.record.json"
    before = json.loads(record.read_text())["finished"]
    corrupt(record, work)
    proc = qq(*quantize_args(built["source"], tmp_path / "a", "--work", str(work)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    running = [line for line in proc.stderr.splitlines() if "stage mtp: running (" in line]
    assert len(running) == 1 and reason in running[0], proc.stderr[-3000:]
    for stage in ("source", "calibration", "gptq", "lm_head", "textonly", "check"):
        assert f"stage {stage}: complete, skipped" in proc.stderr
    rec = json.loads(record.read_text())
    assert rec["finished"] != before and rec["status"] == "complete"
    assert json.loads(proc.stdout)["root_digest"] == built["result"]["root_digest"]


def test_check_failure_fails_the_build_with_rule_ids(built: dict, tmp_path: Path) -> None:
    """A textonly output that vLLM would refuse (mtp not ignored, so vLLM would look for int4 MTP
    weights) is caught by the check stage: exit 6, rule ids in the message, no artifact written."""
    from qwenquant.hashing import sha256_file

    work = Path(shutil.copytree(built["work"], tmp_path / "a.work", ignore=shutil.ignore_patterns(".lock")))
    cfg_path = work / "textonly" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["quantization_config"]["ignore"].remove("re:^mtp.*")
    cfg_path.unlink()
    cfg_path.write_text(json.dumps(cfg, indent=2))
    record_path = work / "textonly.record.json"
    record = json.loads(record_path.read_text())
    record["outputs"]["config.json"] = sha256_file(cfg_path)
    record_path.write_text(json.dumps(_rehash(record)))  # a trusted record of a bad output

    proc = qq(*quantize_args(built["source"], tmp_path / "a", "--work", str(work)))
    assert proc.returncode == 6, proc.stderr[-3000:]
    assert "stage check: running (inputs changed (textonly))" in proc.stderr
    assert "mtp-identical" in proc.stderr and "re:^mtp.*" in proc.stderr
    assert not (tmp_path / "a").exists() and not (work / "check.record.json").exists()


def test_identity_proof_catches_the_norm_rounding_bug(built: dict, tmp_path: Path) -> None:
    """What llm-compressor 0.14's norm_calibration_context does to offset norms, (1 + w) through
    bf16 and back, applied to the finished artifact: the proof that runs on every build flags it."""
    import torch

    from qwenquant.checkpoint.assemble import torch_raw
    from qwenquant.checkpoint.tensorfile import checkpoint_refs, shard_refs, write_shard
    from qwenquant.quantize.stages.check import unquantized_problems
    from qwenquant.recipe import load_recipe

    recipe = load_recipe("w4a16-int4head")
    art = Path(shutil.copytree(built["out"], tmp_path / "art"))
    assert (
        unquantized_problems(art, built["source"], recipe.quantization, head_quantized=True, layout="text-only") == []
    )
    rounded = []
    for shard in sorted(art.glob("model*.safetensors")):
        refs = shard_refs(shard)
        out = dict(refs)
        for name, ref in refs.items():
            if name.endswith("layernorm.weight") or name == "model.norm.weight":
                w = torch.frombuffer(bytearray(ref.read()), dtype=torch.bfloat16)
                w2 = ((1.0 + w.float()).to(torch.bfloat16).float() - 1.0).to(torch.bfloat16)
                if not torch.equal(w.view(torch.int16), w2.view(torch.int16)):
                    out[name] = torch_raw(name, w2.reshape(ref.shape))
                    rounded.append(name)
        if any(n in rounded for n in refs):
            write_shard(shard, list(out.values()))
    assert rounded, "the simulated bug changed nothing"
    problems = unquantized_problems(art, built["source"], recipe.quantization, head_quantized=True, layout="text-only")
    assert {p.split(":")[0] for p in problems} == set(rounded)
    assert all("bytes differ from source tensor " in p for p in problems)
    assert any(p.startswith("model.norm.weight:") for p in problems)
    assert checkpoint_refs(art).keys() == checkpoint_refs(built["out"]).keys()


def test_a_transformers_load_of_the_artifact_quantizes_the_head_despite_the_could_not_match_line(built: dict) -> None:
    """docs/known-issues.md#lm-head-could-not-match: transformers (compressed-tensors 0.19) logs
    "Could not match `re:.*lm_head$`" for every artifact, yet the head gets that group's scheme and its
    packed weights. When a release stops logging it, this fails: drop the known-issues entry."""
    probe = (
        "import json, logging, sys, transformers\n"
        "logging.basicConfig(level=logging.WARNING, stream=sys.stderr)\n"
        "m = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype='auto')\n"
        "h = m.lm_head\n"
        "print(json.dumps({'targets': h.quantization_scheme.targets, 'bits': h.quantization_scheme.weights.num_bits,"
        " 'params': sorted(n for n, _ in h.named_parameters())}))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe, str(built["out"])],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, CUDA_VISIBLE_DEVICES=""),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Could not match `re:.*lm_head$`" in proc.stderr
    head = json.loads(proc.stdout.strip().splitlines()[-1])
    assert head == {
        "targets": ["re:.*lm_head$"],
        "bits": 4,
        "params": ["weight_packed", "weight_scale", "weight_shape"],
    }
