"""The built-in tiny Qwen3.5 checkpoint: bytes, layout, shapes, transformers loading, constant variant."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

import qwenquant
from qwenquant.errors import QwenquantError
from qwenquant.testbed.tiny import build_tiny_checkpoint, constant_token_id

from plain_forwards import fake_quant_int4, load_tensors, mtp_logits

REFERENCE_CONFIG = qwenquant.data_path("qwen3_8-27b.config.json")  # the real model's config
EXPECTED_FILES = {
    "config.json",
    "generation_config.json",
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
    "model-mtp.safetensors",
    "model.safetensors.index.json",
    "preprocessor_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "video_preprocessor_config.json",
}
MTP_NAMES = {
    "mtp.fc.weight",
    "mtp.pre_fc_norm_embedding.weight",
    "mtp.pre_fc_norm_hidden.weight",
    "mtp.norm.weight",
    "mtp.layers.0.input_layernorm.weight",
    "mtp.layers.0.post_attention_layernorm.weight",
    *(f"mtp.layers.0.self_attn.{p}.weight" for p in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm")),
    *(f"mtp.layers.0.mlp.{p}.weight" for p in ("gate_proj", "up_proj", "down_proj")),
}
# GDN a/b projections have one row per value head; recipes keep them bf16 (as on the 27B).
UNQUANTIZED_LINEARS = ("linear_attn.in_proj_a.weight", "linear_attn.in_proj_b.weight")


def digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def shard_names(folder: Path) -> dict[str, set[str]]:
    out = {}
    for shard in sorted(folder.glob("*.safetensors")):
        with safe_open(shard, "pt") as f:
            out[shard.name] = set(f.keys())
            assert f.metadata() == {"format": "pt"}
    return out


@pytest.fixture(scope="module")
def config(tiny_checkpoint: Path) -> dict:
    return json.loads((tiny_checkpoint / "config.json").read_text())


@pytest.fixture(scope="module")
def tensors(tiny_checkpoint: Path) -> dict[str, torch.Tensor]:
    return load_tensors(tiny_checkpoint)


# --- bytes -------------------------------------------------------------------------------------


def test_build_is_byte_identical_in_a_fresh_process(tiny_checkpoint: Path, tmp_path: Path) -> None:
    # A separate process also retrains the tokenizer (cached per process) and runs the entry point.
    out = tmp_path / "again"
    run = subprocess.run(
        [sys.executable, "-m", "qwenquant.testbed.tiny", str(out), "--variant", "random", "--seed", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == str(out)
    assert set(digests(out)) == EXPECTED_FILES
    assert digests(out) == digests(tiny_checkpoint)


def test_the_entry_point_writes_the_demo_s_model_with_variant_reference(tmp_path: Path) -> None:
    """README: `python -m qwenquant.testbed.tiny DIR --variant reference` writes the demo's model."""
    from qwenquant.testbed.tiny.reference_model import build_reference_checkpoint

    out = tmp_path / "ref"
    run = subprocess.run(
        [sys.executable, "-m", "qwenquant.testbed.tiny", str(out), "--variant", "reference"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert digests(out) == digests(build_reference_checkpoint(tmp_path / "lib"))


def test_seed_changes_weights_not_layout(tiny_checkpoint: Path, tmp_path: Path) -> None:
    other = digests(build_tiny_checkpoint(tmp_path / "seed1", seed=1))
    same = digests(tiny_checkpoint)
    for name in EXPECTED_FILES:
        assert (other[name] == same[name]) == (not name.endswith(".safetensors")), name


def test_unknown_variant_is_refused(tmp_path: Path) -> None:
    with pytest.raises(QwenquantError) as exc:
        build_tiny_checkpoint(tmp_path / "x", variant="zeros")
    assert "random, constant" in (exc.value.hint or "")
    assert not (tmp_path / "x").exists()


def test_importing_the_package_stays_light() -> None:
    code = "import sys, qwenquant.testbed.tiny; print(sorted(m for m in ('torch', 'transformers', 'tokenizers') if m in sys.modules))"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"


# --- layout ------------------------------------------------------------------------------------


def test_index_names_every_tensor_once(tiny_checkpoint: Path) -> None:
    index = json.loads((tiny_checkpoint / "model.safetensors.index.json").read_text())
    shards = shard_names(tiny_checkpoint)
    assert len(shards) >= 3
    assert set(index["weight_map"].values()) == set(shards)
    all_names = [n for names in shards.values() for n in names]
    assert len(all_names) == len(set(all_names)) == len(index["weight_map"])
    for shard, names in shards.items():
        assert {n for n, s in index["weight_map"].items() if s == shard} == names
    total = 0
    for shard, names in shards.items():
        with safe_open(tiny_checkpoint / shard, "pt") as f:
            for n in names:
                t = f.get_slice(n)
                assert t.get_dtype() == "BF16", n
                total += 2 * int(torch.Size(t.get_shape()).numel())
    assert index["metadata"]["total_size"] == total


def test_mtp_shard_holds_exactly_the_15_mtp_tensors(tiny_checkpoint: Path) -> None:
    shards = shard_names(tiny_checkpoint)
    assert len(MTP_NAMES) == 15
    assert shards["model-mtp.safetensors"] == MTP_NAMES
    others = set().union(*(v for k, v in shards.items() if k != "model-mtp.safetensors"))
    assert not {n for n in others if n.startswith("mtp.")}
    assert {n.split(".")[0] + "." + n.split(".")[1] for n in others if n.startswith("model.")} == {
        "model.language_model",
        "model.visual",
    }
    assert "lm_head.weight" in others


def test_linear_shapes_suit_int4_kernels(tensors: dict[str, torch.Tensor], config: dict) -> None:
    text = config["text_config"]
    hidden, heads, head_dim = text["hidden_size"], text["num_attention_heads"], text["head_dim"]
    assert tensors["mtp.fc.weight"].shape == (hidden, 2 * hidden)
    assert tensors["mtp.layers.0.self_attn.q_proj.weight"].shape == (2 * heads * head_dim, hidden)
    linears = {n: t for n, t in tensors.items() if t.dim() == 2 and "embed" not in n}
    assert len(linears) > 40
    for name, w in linears.items():
        out_f, in_f = w.shape
        if name.endswith(UNQUANTIZED_LINEARS):
            assert in_f % 128 == 0, name
            continue
        assert out_f % 32 == 0 and in_f % 32 == 0, (name, w.shape)
        if not name.startswith("model.visual."):
            assert in_f % 128 == 0, (name, w.shape)


def test_norm_weights_are_neither_zero_nor_one(tensors: dict[str, torch.Tensor]) -> None:
    norms = {n: t for n, t in tensors.items() if "norm" in n and n.endswith(".weight")}
    assert len(norms) > 20
    for name, w in norms.items():
        assert w.std() > 0.01, name


def test_config_mirrors_the_real_model(config: dict, tiny_checkpoint: Path) -> None:
    real = json.loads(REFERENCE_CONFIG.read_text())
    assert set(real) <= set(config)
    assert set(real["text_config"]) <= set(config["text_config"])
    assert set(real["vision_config"]) <= set(config["vision_config"])
    assert set(real["text_config"]["rope_parameters"]) == set(config["text_config"]["rope_parameters"])
    text = config["text_config"]
    assert config["architectures"] == ["Qwen3_5ForConditionalGeneration"]
    assert (config["model_type"], text["model_type"]) == ("qwen3_5", "qwen3_5_text")
    assert config["torch_dtype"] == config["dtype"] == "bfloat16"
    assert text["mtp_num_hidden_layers"] == 1 and text["full_attention_interval"] == 4
    assert config["tie_word_embeddings"] is False and text["tie_word_embeddings"] is False
    rope = text["rope_parameters"]
    assert sum(rope["mrope_section"]) == int(text["head_dim"] * text["partial_rotary_factor"]) // 2
    assert config["vision_config"]["out_hidden_size"] == text["hidden_size"]
    vocab = json.loads((tiny_checkpoint / "tokenizer.json").read_text())
    ids = {t["content"]: t["id"] for t in vocab["added_tokens"]}
    assert config["image_token_id"] == ids["<|image_pad|>"]
    assert config["video_token_id"] == ids["<|video_pad|>"]
    assert config["vision_start_token_id"] == ids["<|vision_start|>"]
    assert config["vision_end_token_id"] == ids["<|vision_end|>"]
    assert text["eos_token_id"] == ids["<|endoftext|>"]
    assert text["vocab_size"] % 128 == 0 and text["vocab_size"] >= max(ids.values()) + 1
    processor = json.loads((tiny_checkpoint / "preprocessor_config.json").read_text())
    video = json.loads((tiny_checkpoint / "video_preprocessor_config.json").read_text())
    vision = config["vision_config"]
    for proc in (processor, video):
        assert proc["patch_size"] == vision["patch_size"]
        assert proc["temporal_patch_size"] == vision["temporal_patch_size"]
        assert proc["merge_size"] == vision["spatial_merge_size"]


# --- transformers ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def random_model(tiny_checkpoint: Path):
    from transformers import Qwen3_5ForConditionalGeneration

    model, info = Qwen3_5ForConditionalGeneration.from_pretrained(
        tiny_checkpoint, dtype=torch.float32, output_loading_info=True
    )
    return model.eval(), info


def test_loads_in_transformers_without_missing_keys_and_generates(random_model, tiny_checkpoint: Path) -> None:
    from transformers import AutoTokenizer

    model, info = random_model
    assert not info["missing_keys"]
    assert not info["unexpected_keys"] and not info["mismatched_keys"]
    assert model.config.text_config.layer_types == ["linear_attention"] * 3 + ["full_attention"]
    tok = AutoTokenizer.from_pretrained(tiny_checkpoint)
    inputs = tok.apply_chat_template(
        [{"role": "user", "content": "Hello, world!"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    out = model.generate(**inputs, max_new_tokens=5, do_sample=False)
    assert out.shape == (1, inputs["input_ids"].shape[1] + 5)


def test_vision_tower_runs_and_reaches_the_text_model(random_model) -> None:
    from qwenquant.testbed.tiny.tokenizer import token_ids

    model, _ = random_model
    ids = token_ids()
    grid = torch.tensor([[1, 4, 6]])  # 24 patches of 3x2x16x16, merged 2x2 into 6 image tokens
    pixels = torch.randn(24, 3 * 2 * 16 * 16, generator=torch.Generator().manual_seed(0))
    prompt = [
        ids["<|im_start|>"],
        100,
        ids["<|vision_start|>"],
        *[ids["<|image_pad|>"]] * 6,
        ids["<|vision_end|>"],
        200,
    ]
    input_ids = torch.tensor([prompt])
    mm = (input_ids == ids["<|image_pad|>"]).int()
    with torch.no_grad():
        seen = model(input_ids=input_ids, pixel_values=pixels, image_grid_thw=grid, mm_token_type_ids=mm).logits
        blank = model(input_ids=input_ids, pixel_values=pixels * 0, image_grid_thw=grid, mm_token_type_ids=mm).logits
    assert torch.isfinite(seen).all()
    assert (seen - blank).abs().max() > 1e-3


def test_tokenizer_loads_and_chat_template_is_chatml(tiny_checkpoint: Path) -> None:
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_checkpoint)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What time is it?"}]
    assert tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat time is it?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert tok.apply_chat_template(messages, tokenize=False).endswith("What time is it?<|im_end|>\n")
    image = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe it."}]}]
    assert "<|vision_start|><|image_pad|><|vision_end|>Describe it." in tok.apply_chat_template(image, tokenize=False)
    raw = Tokenizer.from_file(str(tiny_checkpoint / "tokenizer.json"))
    text = "def greet(name):\n    return f'Hello, {name}!' <|im_end|> the river runs, 2026."
    assert tok.encode(text, add_special_tokens=False) == raw.encode(text, add_special_tokens=False).ids
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert tok.convert_tokens_to_ids("<think>") == tok.convert_tokens_to_ids("</think>") - 1
    assert tok.encode(" the", add_special_tokens=False) == [constant_token_id()]


def _target(model, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        out = model(input_ids=ids, output_hidden_states=True)
    return out.logits, out.hidden_states[-1]


def _random_ids(vocab: int = 1018) -> torch.Tensor:
    return torch.randint(0, vocab, (2, 48), generator=torch.Generator().manual_seed(7))


def test_random_mtp_head_disagrees_with_the_target(random_model, tiny_checkpoint: Path, tensors) -> None:
    model, _ = random_model
    ids = _random_ids()
    logits, hidden = _target(model, ids)
    draft = mtp_logits(tiny_checkpoint, tensors, ids, hidden).argmax(-1)  # guesses token i+2
    agree = (draft == logits[:, 1:].argmax(-1)).float().mean().item()
    assert agree < 0.2


@pytest.mark.parametrize("quantized", [False, True], ids=["bf16", "int4-rtn"])
def test_constant_variant_predicts_one_token_everywhere(tiny_constant_checkpoint: Path, quantized: bool) -> None:
    from transformers import Qwen3_5ForConditionalGeneration

    token = constant_token_id()
    model = Qwen3_5ForConditionalGeneration.from_pretrained(tiny_constant_checkpoint, dtype=torch.float32).eval()
    tensors = load_tensors(tiny_constant_checkpoint)
    if quantized:  # int4 every Linear of the body, lm_head and MTP head (more than any recipe does)
        tensors = {
            n: fake_quant_int4(t) if t.dim() == 2 and "embed" not in n and not n.startswith("model.visual") else t
            for n, t in tensors.items()
        }
        model.load_state_dict({n: tensors[n] for n in model.state_dict()})
    ids = _random_ids()
    ids[0, :8] = token  # also runs of the constant token itself
    logits, hidden = _target(model, ids)
    assert (logits.argmax(-1) == token).all()
    captured = {}
    model.model.language_model.norm.register_forward_hook(lambda m, a, o: captured.setdefault("pre_norm", a[0]))
    _target(model, ids)
    for h in (hidden, captured["pre_norm"]):  # vLLM may hand the drafter either
        draft = mtp_logits(tiny_constant_checkpoint, tensors, ids, h)
        assert (draft.argmax(-1) == token).all()
        assert (draft[..., token] - draft.topk(2, -1).values[..., 1]).min() > 20


def test_tiny_copy_is_a_private_copy(tiny_copy: Path, tiny_checkpoint: Path) -> None:
    before = digests(tiny_checkpoint)
    assert digests(tiny_copy) == before
    (tiny_copy / "config.json").write_text("{}")
    (tiny_copy / "model-mtp.safetensors").unlink()
    assert digests(tiny_checkpoint) == before
