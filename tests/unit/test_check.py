"""`qwenquant check`: one broken artifact per rule, each caught with its rule id and the tensor named.

Fixture artifacts are built in code: config dicts plus tiny safetensors files (zeros, right names,
dtypes and shapes) in the layout llm-compressor 0.14 writes; no torch, no llm-compressor.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import pytest

from qwenquant.check import check_artifact
from qwenquant.checkpoint.header import DTYPE_BYTES
from qwenquant.checkpoint.tensorfile import RawTensor, write_shard
from qwenquant.cli import main
from qwenquant.errors import CheckError

H, I, V = 256, 512, 1024  # hidden, intermediate, vocab
HEADS, KV, HD = 4, 2, 64
GK, GV, GD = 2, 4, 64  # GDN key heads, value heads, head dim
GS = 128
IGNORE = ["re:.*visual.*", "re:^mtp.*", "re:.*linear_attn.in_proj_a$", "re:.*linear_attn.in_proj_b$"]


class Fx:
    """An artifact in memory: config + {tensor: (dtype, shape)}; `write` puts it on disk."""

    def __init__(self, layout: str = "text-only", prefix: str = "model.language_model.") -> None:
        self.layout = layout
        self.shape_override: dict[str, tuple[int, int]] = {}
        self.t: dict[str, tuple[str, tuple[int, ...]]] = {}
        text = {
            "model_type": "qwen3_5_text",
            "hidden_size": H,
            "num_hidden_layers": 4,
            "mtp_num_hidden_layers": 1,
            "rope_parameters": {"rope_theta": 10000000, "rope_type": "default", "partial_rotary_factor": 0.25},
        }
        qc = {
            "quant_method": "compressed-tensors",
            "format": "pack-quantized",
            "ignore": list(IGNORE),
            "config_groups": {
                "group_0": {
                    "targets": ["Linear"],
                    "format": "pack-quantized",
                    "input_activations": None,
                    "weights": {
                        "num_bits": 4,
                        "type": "int",
                        "symmetric": True,
                        "strategy": "group",
                        "group_size": GS,
                        "actorder": "static",
                    },
                },
                "group_1": {
                    "targets": ["re:.*lm_head$"],
                    "format": "pack-quantized",
                    "input_activations": None,
                    "weights": {
                        "num_bits": 4,
                        "type": "int",
                        "symmetric": True,
                        "strategy": "group",
                        "group_size": GS,
                        "actorder": None,
                    },
                },
            },
        }
        if layout == "text-only":
            self.config: dict[str, Any] = {"architectures": ["Qwen3_5ForCausalLM"], **text, "quantization_config": qc}
        else:
            text["rope_parameters"] |= {"mrope_section": [3, 3, 2], "mrope_interleaved": True}
            self.config = {
                "architectures": ["Qwen3_5ForConditionalGeneration"],
                "model_type": "qwen3_5",
                "text_config": text,
                "vision_config": {"depth": 1, "hidden_size": 64},
                "quantization_config": qc,
            }
        p = prefix
        self.bf16(f"{p}embed_tokens.weight", V, H)
        self.bf16(f"{p}norm.weight", H)
        for i in range(4):
            L = f"{p}layers.{i}."
            if i == 3:
                for name, out, inp in (
                    ("q_proj", 2 * HEADS * HD, H),
                    ("k_proj", KV * HD, H),
                    ("v_proj", KV * HD, H),
                    ("o_proj", H, HEADS * HD),
                ):
                    self.q(f"{L}self_attn.{name}", out, inp)
                self.bf16(f"{L}self_attn.q_norm.weight", HD)
                self.bf16(f"{L}self_attn.k_norm.weight", HD)
            else:
                A = f"{L}linear_attn."
                self.q(f"{A}in_proj_qkv", 2 * GK * GD + GV * GD, H)
                self.q(f"{A}in_proj_z", GV * GD, H)
                self.bf16(f"{A}in_proj_b.weight", GV, H)
                self.bf16(f"{A}in_proj_a.weight", GV, H)
                self.bf16(f"{A}conv1d.weight", 2 * GK * GD + GV * GD, 1, 4)
                self.bf16(f"{A}dt_bias", GV)
                self.t[f"{A}A_log"] = ("F32", (GV,))
                self.bf16(f"{A}norm.weight", GD)
                self.q(f"{A}out_proj", H, GV * GD)
            for name, out, inp in (("gate_proj", I, H), ("up_proj", I, H), ("down_proj", H, I)):
                self.q(f"{L}mlp.{name}", out, inp)
            self.bf16(f"{L}input_layernorm.weight", H)
            self.bf16(f"{L}post_attention_layernorm.weight", H)
        self.q("lm_head", V, H)
        for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
            self.bf16(f"mtp.{n}.weight", H)
        self.bf16("mtp.fc.weight", H, 2 * H)
        M = "mtp.layers.0."
        self.bf16(f"{M}input_layernorm.weight", H)
        self.bf16(f"{M}post_attention_layernorm.weight", H)
        for name, out, inp in (
            ("q_proj", 2 * HEADS * HD, H),
            ("k_proj", KV * HD, H),
            ("v_proj", KV * HD, H),
            ("o_proj", H, HEADS * HD),
            ("gate_proj", I, H),
            ("up_proj", I, H),
            ("down_proj", H, I),
        ):
            sub = "mlp" if name in ("gate_proj", "up_proj", "down_proj") else "self_attn"
            self.bf16(f"{M}{sub}.{name}.weight", out, inp)
        self.bf16(f"{M}self_attn.q_norm.weight", HD)
        self.bf16(f"{M}self_attn.k_norm.weight", HD)
        if layout == "multimodal":
            vis = "model.visual."
            self.bf16(f"{vis}patch_embed.proj.weight", 64, 3, 2, 2, 2)
            self.bf16(f"{vis}pos_embed.weight", 16, 64)
            self.bf16(f"{vis}blocks.0.attn.qkv.weight", 192, 64)
            self.bf16(f"{vis}blocks.0.attn.proj.weight", 64, 64)
            self.bf16(f"{vis}blocks.0.mlp.linear_fc1.weight", 128, 64)
            self.bf16(f"{vis}blocks.0.mlp.linear_fc2.weight", 64, 128)
            self.bf16(f"{vis}merger.linear_fc1.weight", 256, 256)
            self.bf16(f"{vis}merger.linear_fc2.weight", H, 256)

    def bf16(self, name: str, *shape: int) -> None:
        self.t[name] = ("BF16", shape)

    def q(self, mod: str, out: int, inp: int, gs: int = GS) -> None:
        self.t.pop(f"{mod}.weight", None)
        self.t[f"{mod}.weight_packed"] = ("I32", (out, inp // 8))
        self.t[f"{mod}.weight_scale"] = ("BF16", (out, inp // gs))
        self.t[f"{mod}.weight_shape"] = ("I32", (2,))

    def unq(self, mod: str) -> None:
        out, cols = self.t[f"{mod}.weight_packed"][1]
        for s in ("weight_packed", "weight_scale", "weight_shape"):
            self.t.pop(f"{mod}.{s}")
        self.bf16(f"{mod}.weight", out, cols * 8)

    @property
    def qc(self) -> dict[str, Any]:
        return self.config["quantization_config"]

    def write(self, d: Path, *, index_drop: str | None = None) -> Path:
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.json").write_text(json.dumps(self.config, indent=2))
        shards: dict[str, list[str]] = {"model-00001-of-00002.safetensors": [], "model-00002-of-00002.safetensors": []}
        for k, name in enumerate(sorted(n for n in self.t if not n.startswith("mtp."))):
            shards[list(shards)[k % 2]].append(name)
        mtp = sorted(n for n in self.t if n.startswith("mtp."))
        if mtp:
            shards["model_mtp.safetensors"] = mtp
        weight_map = {}
        for fname, names in shards.items():
            tensors = []
            for n in names:
                dtype, shape = self.t[n]
                if n.endswith(".weight_shape"):
                    mod = n.removesuffix(".weight_shape")
                    out, cols = self.t[f"{mod}.weight_packed"][1]
                    vals = self.shape_override.get(mod, (out, cols * 8))
                    blob = struct.pack("<2i" if dtype == "I32" else "<2q", *vals)
                else:
                    blob = bytes(DTYPE_BYTES[dtype] * math.prod(shape))
                tensors.append(RawTensor(n, dtype, tuple(shape), blob))
                weight_map[n] = fname
            write_shard(d / fname, tensors)
        if index_drop:
            weight_map.pop(index_drop)
        (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
        return d


def _check(fx: Fx, tmp_path: Path, **kw: Any):
    return check_artifact(fx.write(tmp_path / "art", **kw))


def _only(report, rule: str) -> list[str]:
    assert report.rule_ids() == [rule], [str(f) for f in report.findings]
    return [f"{f.where}: {f.message} — {f.fix}" for f in report.findings]


@pytest.mark.parametrize(
    "layout, prefix",
    [("text-only", "model.language_model."), ("text-only", "model."), ("multimodal", "model.language_model.")],
)
def test_good_artifact_passes(tmp_path: Path, layout: str, prefix: str) -> None:
    r = _check(Fx(layout, prefix), tmp_path)
    assert r.ok, [str(f) for f in r.findings]
    assert r.layout == layout and len(r.rules_run) == 13


def test_text_only_ignore_names_follow_the_loader_mapping(tmp_path: Path) -> None:
    """Qwen3_5ForCausalLM maps model.language_model.* to model.* for tensors and ignore entries alike."""
    fx = Fx("text-only", "model.")
    fx.qc["ignore"] = [e for e in fx.qc["ignore"] if "in_proj" not in e] + [
        f"model.language_model.layers.{i}.linear_attn.in_proj_{g}" for i in range(3) for g in "ab"
    ]
    assert _check(fx, tmp_path).ok
    fx.qc["ignore"] = [e for e in fx.qc["ignore"] if "layers.2" not in e]
    r = check_artifact(fx.write(tmp_path / "b"))
    assert r.rule_ids() == ["scheme-storage"]
    assert {f.where for f in r.findings} == {f"model.layers.2.linear_attn.in_proj_{g}.weight" for g in "ab"}


def test_cli_ok_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = Fx().write(tmp_path / "art")
    assert main(["check", str(d)]) == 0
    assert capsys.readouterr().out.startswith("OK ")
    fx = Fx()
    fx.qc["ignore"].append("re:.*in_proj_z$")
    bad = fx.write(tmp_path / "bad")
    assert main(["check", str(bad), "--json"]) == CheckError.exit_code
    cap = capsys.readouterr()
    assert json.loads(cap.out)["ok"] is False and "fused-scheme" in cap.err


# (1) fused layers share one scheme ----------------------------------------------------------


def test_fused_gdn_gate_half_quantized(tmp_path: Path) -> None:
    fx = Fx()
    fx.q("model.language_model.layers.0.linear_attn.in_proj_b", GV, H)
    fx.qc["ignore"].remove("re:.*linear_attn.in_proj_b$")
    msgs = [str(f) for f in _check(fx, tmp_path).findings if f.rule == "fused-scheme"]
    assert any(
        "model.language_model.layers.0.linear_attn.in_proj_ba" in m
        and "in_proj_b=int4 packed" in m
        and "in_proj_a=bf16" in m
        for m in msgs
    ), msgs


def test_fused_ignore_disagrees(tmp_path: Path) -> None:
    fx = Fx()
    fx.qc["ignore"].append("re:.*in_proj_z$")
    r = _check(fx, tmp_path)
    assert "fused-scheme" in r.rule_ids()
    assert any(
        f.rule == "fused-scheme"
        and f.where.endswith("layers.0.linear_attn.in_proj_qkvz")
        and "in_proj_z: ignored" in f.message
        for f in r.findings
    )


def test_fused_qkv_storage_disagrees(tmp_path: Path) -> None:
    fx = Fx()
    fx.unq("model.language_model.layers.3.self_attn.v_proj")
    r = _check(fx, tmp_path)
    assert any(
        f.rule == "fused-scheme" and f.where == "model.language_model.layers.3.self_attn.qkv_proj" for f in r.findings
    )


def test_body_layer_stored_bf16_but_targeted(tmp_path: Path) -> None:
    fx = Fx()
    fx.unq("model.language_model.layers.1.linear_attn.out_proj")
    msgs = _only(_check(fx, tmp_path), "scheme-storage")
    assert msgs[0].startswith("model.language_model.layers.1.linear_attn.out_proj.weight: stored bf16")


# (2) kernel shapes --------------------------------------------------------------------------


def test_quantized_rows_not_multiple_of_64(tmp_path: Path) -> None:
    fx = Fx()
    for g in ("in_proj_a", "in_proj_b"):
        fx.q(f"model.language_model.layers.0.linear_attn.{g}", GV, H)
    fx.qc["ignore"] = [e for e in fx.qc["ignore"] if "in_proj" not in e]
    r = _check(fx, tmp_path)
    assert "kernel-shape" in r.rule_ids()
    f = next(f for f in r.findings if f.rule == "kernel-shape")
    assert f.where == "model.language_model.layers.0.linear_attn.in_proj_a.weight_packed"
    assert "[4 out, 256 in]" in f.message and "CPU kernel needs in/out multiples of 32" in f.message
    assert "bf16" in f.fix


def test_rows_a_marlin_tile_pads_are_no_load_problem(tmp_path: Path) -> None:
    """96 rows (a multiple of 32, not of Marlin's 64-row tile): every CUDA release of the version table zero-pads
    them (vllm #45295, read in 0.26.0's kernels/linear/mixed_precision/marlin.py) and the CPU kernel takes them,
    so check passes; the in_proj_a/b rule is a quality one there."""
    fx = Fx()
    mod = "model.language_model.layers.0.mlp.gate_proj"
    fx.q(mod, 96, H)
    fx.q(mod.replace("gate_proj", "up_proj"), 96, H)
    down = mod.replace("gate_proj", "down_proj")  # 96 inputs are not a 128-group: bf16
    (
        fx.t.pop(f"{down}.weight_packed", None),
        fx.t.pop(f"{down}.weight_scale", None),
        fx.t.pop(f"{down}.weight_shape", None),
    )
    fx.bf16(f"{down}.weight", H, 96)
    fx.qc["ignore"].append("re:.*layers[.]0[.]mlp[.]down_proj$")
    r = _check(fx, tmp_path)
    assert not [f for f in r.findings if f.rule == "kernel-shape"], [str(f) for f in r.findings]


def test_in_features_not_multiple_of_group_size(tmp_path: Path) -> None:
    fx = Fx()
    mod = "model.language_model.layers.0.mlp.down_proj"
    fx.q(mod, H, 480, gs=96)  # 480 = 15 x 32 fits CPU, but the config's group is 128
    r = _check(fx, tmp_path)
    assert any(
        f.rule == "kernel-shape" and f.where == f"{mod}.weight_packed" and "group_size 128" in f.message
        for f in r.findings
    ), [str(f) for f in r.findings]


def test_packed_tensor_wrong_dtype(tmp_path: Path) -> None:
    fx = Fx()
    fx.t["model.language_model.layers.0.mlp.up_proj.weight_scale"] = ("F32", (I, H // GS))
    fx.t["model.language_model.layers.0.mlp.up_proj.weight_packed"] = ("BF16", (I, H // 8))
    msgs = _only(_check(fx, tmp_path), "packed-format")
    assert msgs[0].startswith("model.language_model.layers.0.mlp.up_proj.weight_packed: is BF16")


# (3) lm_head --------------------------------------------------------------------------------


def test_lm_head_bare_target_and_ignored(tmp_path: Path) -> None:
    fx = Fx()
    fx.qc["config_groups"]["group_1"]["targets"] = ["lm_head"]
    fx.qc["ignore"].append("lm_head")
    msgs = _only(_check(fx, tmp_path), "lm-head")
    assert any("re:.*lm_head$" in m for m in msgs)
    assert any(m.startswith("lm_head: is listed in quantization_config.ignore") for m in msgs)


def test_lm_head_stored_bf16(tmp_path: Path) -> None:
    fx = Fx()
    fx.unq("lm_head")
    msgs = _only(_check(fx, tmp_path), "lm-head")
    assert msgs == [
        "lm_head.weight: is stored bf16, not int4 packed — run the lm_head stage (recipe lm_head.enabled: true)"
    ]


# (4) mtp ------------------------------------------------------------------------------------


def test_mtp_not_ignored_and_missing_tensor(tmp_path: Path) -> None:
    fx = Fx()
    fx.qc["ignore"].remove("re:^mtp.*")
    del fx.t["mtp.layers.0.self_attn.k_norm.weight"]
    msgs = _only(_check(fx, tmp_path), "mtp")
    assert any(m.startswith("mtp.layers.0.self_attn.k_norm.weight: missing (15 mtp.* tensors") for m in msgs)
    assert any(m.startswith("mtp.fc: not covered by quantization_config.ignore") and "#53387" in m for m in msgs)


def test_mtp_quantized_but_ignored(tmp_path: Path) -> None:
    """A packed mtp.fc under `re:^mtp.*`: vLLM builds it bf16 and refuses the packed tensors (#53387);
    the other MTP Linears stay bf16, a mix the drafter cannot take."""
    fx = Fx()
    fx.q("mtp.fc", H, 2 * H)
    msgs = _only(_check(fx, tmp_path), "mtp")
    assert any(m.startswith("mtp.fc: stored int4 packed but no config group applies") and "#53387" in m for m in msgs)
    assert any(m.startswith("mtp.*: 1 of 8 MTP Linears are int4 packed") for m in msgs)


def _int4_mtp(fx: Fx) -> Fx:
    """Every MTP Linear packed (mtp.quantize: gptq), norms bf16."""
    M = "mtp.layers.0."
    fx.q("mtp.fc", H, 2 * H)
    for name, out, inp in (
        ("self_attn.q_proj", 2 * HEADS * HD, H),
        ("self_attn.k_proj", KV * HD, H),
        ("self_attn.v_proj", KV * HD, H),
        ("self_attn.o_proj", H, HEADS * HD),
        ("mlp.gate_proj", I, H),
        ("mlp.up_proj", I, H),
        ("mlp.down_proj", H, I),
    ):
        fx.q(M + name, out, inp)
    return fx


def test_int4_mtp_head_loads_when_not_ignored(tmp_path: Path) -> None:
    fx = _int4_mtp(Fx())
    fx.qc["ignore"].remove("re:^mtp.*")
    assert _check(fx, tmp_path).ok
    fx.qc["ignore"].append("re:^mtp.*")  # the same tensors under the bf16 head's ignore entry
    msgs = _only(_check(fx, tmp_path / "ignored"), "mtp")
    assert len(msgs) == 8 and all("no config group applies" in m and "#53387" in m for m in msgs)


def test_mtp_shard_missing_from_index(tmp_path: Path) -> None:
    r = _check(Fx(), tmp_path, index_drop="mtp.norm.weight")
    assert "index" in r.rule_ids()
    assert any(f.rule == "index" and "model_mtp.safetensors holds mtp.norm.weight" in f.message for f in r.findings)


# (5) mrope in text-only -----------------------------------------------------------------------


def test_mrope_in_text_only(tmp_path: Path) -> None:
    fx = Fx()
    fx.config["rope_parameters"]["mrope_section"] = [3, 3, 2]
    fx.config["rope_parameters"]["rope_type"] = "mrope"
    msgs = _only(_check(fx, tmp_path), "no-mrope")
    assert msgs[0].startswith("config.json:rope_parameters.mrope_section: mrope in a text-only")
    assert msgs[1].startswith("config.json:rope_parameters.rope_type: mrope in a text-only")
    assert _check(Fx("multimodal"), tmp_path / "mm").ok  # multimodal keeps its mrope


# (6) vision ---------------------------------------------------------------------------------


def test_text_only_with_vision_leftovers(tmp_path: Path) -> None:
    fx = Fx()
    fx.config["vision_config"] = {"depth": 1}
    fx.bf16("model.visual.blocks.0.attn.qkv.weight", 192, 64)
    msgs = _only(_check(fx, tmp_path), "vision")
    assert any(m.startswith("config.json:vision_config: present in a text-only config") for m in msgs)
    assert any(m.startswith("model.visual.blocks.0.attn.qkv.weight: 1 vision tensors") for m in msgs)


def test_multimodal_vision_quantized_or_targeted(tmp_path: Path) -> None:
    fx = Fx("multimodal")
    fx.qc["ignore"].remove("re:.*visual.*")
    fx.q("model.visual.merger.linear_fc1", 256, 256)
    msgs = _only(_check(fx, tmp_path), "vision")
    assert any(m.startswith("model.visual.merger.linear_fc1.weight_packed: vision Linear stored int4") for m in msgs)
    assert any(m.startswith("model.visual.blocks.0.attn.qkv: bf16 but config group group_0") for m in msgs)


# (7) index and headers ------------------------------------------------------------------------


def test_index_names_missing_tensor(tmp_path: Path) -> None:
    d = Fx().write(tmp_path / "art")
    idx = json.loads((d / "model.safetensors.index.json").read_text())
    idx["weight_map"]["model.language_model.layers.9.mlp.up_proj.weight"] = "model-00001-of-00002.safetensors"
    (d / "model.safetensors.index.json").write_text(json.dumps(idx))
    r = check_artifact(d)
    assert r.rule_ids() == ["index"]
    assert "model.language_model.layers.9.mlp.up_proj.weight" in r.findings[0].message


def test_truncated_shard_header(tmp_path: Path) -> None:
    d = Fx().write(tmp_path / "art")
    shard = d / "model-00002-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-10])
    r = check_artifact(d)
    assert "safetensors-header" in r.rule_ids()
    assert any(f.where == "model-00002-of-00002.safetensors" for f in r.findings if f.rule == "safetensors-header")


def test_weight_shape_int64_is_accepted_but_wrong_values_are_not(tmp_path: Path) -> None:
    fx = Fx()
    fx.t["model.language_model.layers.0.mlp.gate_proj.weight_shape"] = ("I64", (2,))  # compressed-tensors writes int64
    assert check_artifact(fx.write(tmp_path / "a")).ok
    fx.shape_override["model.language_model.layers.0.mlp.gate_proj"] = (I, H + 8)
    msgs = _only(check_artifact(fx.write(tmp_path / "b")), "packed-format")
    assert msgs[0].startswith("model.language_model.layers.0.mlp.gate_proj.weight_shape: says [512, 264]")


def test_quant_config_wrong_bits_and_format(tmp_path: Path) -> None:
    fx = Fx()
    fx.qc["config_groups"]["group_0"]["weights"]["num_bits"] = 8
    fx.qc["config_groups"]["group_0"]["format"] = "naive-quantized"
    msgs = _only(_check(fx, tmp_path), "quant-config")
    assert any("group_0.weights.num_bits: is 8" in m for m in msgs)
    assert any("group_0: format is 'naive-quantized'" in m for m in msgs)


def test_mixed_name_prefixes(tmp_path: Path) -> None:
    fx = Fx()
    fx.bf16("model.layers.0.input_layernorm.weight", H)
    msgs = _only(_check(fx, tmp_path), "layout")
    assert "more than one name prefix" in msgs[0]


def test_missing_folder_and_empty_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(tmp_path / "nope")]) == 2  # a missing path is a usage error in every command
    assert "does not exist" in capsys.readouterr().err
    assert main(["check", str(tmp_path)]) == 2  # an empty folder is not an artifact: a usage error too
    assert f"{tmp_path} holds no config.json and no safetensors file: it is not an artifact" in " ".join(
        capsys.readouterr().err.split()
    )
    (tmp_path / "model.safetensors").write_bytes(b"")  # a shard and no config: what vLLM would refuse
    r = check_artifact(tmp_path)
    assert not r.ok and {"layout", "safetensors-header"} <= set(r.rule_ids())


# (9) draft tokens vLLM's GDN speculative path survives ------------------------------------------


def test_profile_drafting_more_than_four_tokens_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A manifest whose recipe drafts 5 tokens in one profile: check names that profile and vllm #37035."""
    d = Fx().write(tmp_path / "art")
    serve = {
        "defaults": {"speculative": {"method": "mtp", "num_speculative_tokens": 3}},
        "profiles": {
            "single-user": {},
            "fast": {"speculative": {"method": "mtp", "num_speculative_tokens": 5}},
            "batch": {"speculative": None},
        },
    }
    (d / "qwenquant-manifest.json").write_text(json.dumps({"recipe": {"serve": serve}}))
    r = check_artifact(d)
    assert _only(r, "speculative") == [
        "qwenquant-manifest.json:recipe.serve.profiles.fast.speculative: num_speculative_tokens 5 is above 4: "
        "vLLM's Gated DeltaNet speculative path crashes with more than 4 draft tokens (vllm #37035) — draft at "
        "most 4 tokens (the recipes draft 3): set speculative.num_speculative_tokens, or pass --speculative-config "
        '\'{"method": "mtp", "num_speculative_tokens": 3}\' after --'
    ]
    assert main(["check", str(d)]) == CheckError.exit_code
    assert "speculative at qwenquant-manifest.json:recipe.serve.profiles.fast.speculative" in capsys.readouterr().err
    serve["profiles"]["fast"]["speculative"]["num_speculative_tokens"] = 4
    (d / "qwenquant-manifest.json").write_text(json.dumps({"recipe": {"serve": serve}}))
    assert check_artifact(d).ok


def test_vllm_releases_that_load_an_int4_mtp_head() -> None:
    """check knows the releases whose MTP loader builds a quantized drafter (the version table's rows: 0.26-0.34
    read); the quantize check stage refuses a recipe admitting another, serve an installed other, naming vLLM
    #53387."""
    from qwenquant.check import mtp_vllm_problems, quantized_mtp_vllm_problem
    from qwenquant.check.mtp_vllm import HINT
    from qwenquant.recipe import load_recipe

    assert quantized_mtp_vllm_problem("0.26.0") is None and quantized_mtp_vllm_problem("0.32.0") is None
    assert quantized_mtp_vllm_problem("0.34.0") is None and quantized_mtp_vllm_problem("0.32.0", "cpu") is None
    assert "not known to load" in quantized_mtp_vllm_problem("0.25.1") and "#53387" in HINT
    r = load_recipe("w4a16-int4head-int4mtp")
    assert mtp_vllm_problems(r) == []
    wide = r.model_copy(update={"serve": r.serve.model_copy(update={"vllm_versions": [">=0.26.0"]})})
    (msg,) = mtp_vllm_problems(wide)
    assert "admit vLLM 0.35.0, 1.0.0" in msg and "#53387" in msg
    assert mtp_vllm_problems(load_recipe("w4a16-int4head")) == []  # a bf16 head loads anywhere


@pytest.mark.parametrize(
    ("weights", "said"),
    [
        ({"strategy": "channel", "group_size": None}, "strategy channel quantizes mtp.fc with one scale per row"),
        (
            {"strategy": "group", "group_size": 512},
            "group_size 512 puts mtp.fc's group of columns 0-511 across column 256",
        ),
    ],
)
def test_an_mtp_fc_grouping_that_mixes_embedding_and_hidden_is_refused(tmp_path: Path, capsys, weights, said) -> None:
    """mtp.fc's input is [embedding ; hidden] (2H = 512 here): a channelwise scale, or a group across column H, rounds
    the embedding half to zero (0% acceptance, no error); check exits 6 naming the config group's field."""
    fx = _int4_mtp(Fx())
    fx.qc["ignore"].remove("re:^mtp.*")
    fx.qc["config_groups"]["a_mtp_fc"] = {
        "targets": ["re:^mtp[.]fc$"],
        "format": "pack-quantized",
        "input_activations": None,
        "weights": {"num_bits": 4, "type": "int", "symmetric": True, "actorder": None, **weights},
    }
    fx.q("mtp.fc", H, 2 * H, gs=weights["group_size"] or 2 * H)
    report = _check(fx, tmp_path)  # a channelwise group is also quant-config's finding (W4A16 is group-wise)
    msgs = [f"{f.where}: {f.message} — {f.fix}" for f in report.findings if f.rule == "mtp"]
    assert msgs == [m for m in msgs if m.startswith("mtp.fc: quantization_config.config_groups.a_mtp_fc.weights: ")]
    assert len(msgs) == 1 and said in msgs[0] and "use a group_size dividing hidden_size 256" in msgs[0]
    capsys.readouterr()
    assert main(["check", str(tmp_path / "art")]) == CheckError.exit_code == 6
    assert "mtp at mtp.fc" in " ".join(capsys.readouterr().err.split())


def test_the_recipe_hidden_size_is_the_27b_s() -> None:
    from qwenquant import data_path
    from qwenquant.recipe.mtpfc import RECIPE_HIDDEN

    cfg = json.loads(data_path("qwen3_8-27b.config.json").read_text())
    assert RECIPE_HIDDEN == cfg.get("text_config", cfg)["hidden_size"]
