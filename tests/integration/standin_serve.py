"""The stand-in serving setup shared by test modules: an artifact of zero int4 weights with a real
manifest, and a vLLM launcher whose entrypoint is tests/integration/standin_server.py (STAND-IN:
not vLLM; a real vLLM does not fail on demand or answer fixed texts), with a stub `vllm` package
so serve's discovery and architecture probe run for real."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from helpers import write_test_manifest

STANDIN = Path(__file__).with_name("standin_server.py")
ARCHS = ["Qwen3_5ForConditionalGeneration", "Qwen3_5ForCausalLM"]
W4 = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 128,
      "dynamic": False, "actorder": None, "observer": "minmax"}


def _is_packed_linear(name: str) -> bool:
    if "visual" in name or name.startswith("mtp.") or "in_proj_a" in name or "in_proj_b" in name:
        return False
    leaf = name.rsplit(".", 2)[-2] if name.endswith(".weight") else ""
    return leaf.endswith("_proj") or leaf in ("in_proj_qkv", "in_proj_z") or name == "lm_head.weight"


def build_standin_artifact(tiny: Path, out: Path) -> Path:
    """The tiny checkpoint as a pack-quantized multimodal-layout artifact (zeros) with a manifest."""
    import torch
    from safetensors.torch import load_file, save_file

    from qwenquant.recipe import load_recipe

    out.mkdir(parents=True)
    tensors: dict[str, torch.Tensor] = {}
    for f in sorted(tiny.glob("*.safetensors")):
        for name, t in load_file(f).items():
            if _is_packed_linear(name):
                rows, cols = t.shape
                mod = name[: -len(".weight")]
                tensors[mod + ".weight_packed"] = torch.zeros(rows, cols // 8, dtype=torch.int32)
                tensors[mod + ".weight_scale"] = torch.ones(rows, cols // 128, dtype=torch.bfloat16)
                tensors[mod + ".weight_shape"] = torch.tensor([rows, cols], dtype=torch.int64)
            else:
                tensors[name] = t
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((tiny / "config.json").read_text())
    group = {"weights": W4, "input_activations": None, "output_activations": None, "format": "pack-quantized"}
    config["quantization_config"] = {
        "quant_method": "compressed-tensors", "format": "pack-quantized",
        "config_groups": {"group_0": {**group, "targets": ["Linear"]},
                          "group_1": {**group, "targets": ["re:.*lm_head$"]}},
        "ignore": ["re:.*visual.*", "re:^mtp.*", "re:.*linear_attn.in_proj_a$", "re:.*linear_attn.in_proj_b$"],
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))
    for name in ("generation_config.json", "preprocessor_config.json", "video_preprocessor_config.json",
                 "tokenizer.json", "tokenizer_config.json"):
        if (tiny / name).exists():
            (out / name).write_bytes((tiny / name).read_bytes())
    recipe = load_recipe("w4a16-int4head").canonical()
    recipe["artifact"]["layout"] = "multimodal"
    write_test_manifest(out, recipe)
    return out


def write_fake_vllm(root: Path) -> Path:
    """A launcher json whose entrypoint is the stand-in, and an importable stub `vllm` package
    (version, CPU platform, registry) so discovery and the architecture probe run for real."""
    pkg = root / "site" / "vllm"
    (pkg / "platforms").mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        f"__version__ = '0.33.0'\nclass ModelRegistry:\n    @staticmethod\n"
        f"    def get_supported_archs():\n        return {ARCHS!r}\n")
    (pkg / "platforms" / "__init__.py").write_text(
        "class _P:\n    device_type = 'cpu'\ncurrent_platform = _P()\n")
    launcher = root / "qwenquant-vllm.json"
    launcher.write_text(json.dumps({"python": sys.executable, "entrypoint": [sys.executable, str(STANDIN)],
                                    "vllm_version": "0.33.0", "device": "cpu"}))
    return launcher


def serve_env(launcher: Path, tmp_path: Path) -> dict[str, str]:
    """The environment for `qwenquant serve` with the stand-in launcher (its stub vllm importable)."""
    env = dict(os.environ)
    # the stub vllm first; then whatever put this checkout's qwenquant on the path
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(launcher.parent / "site"), env.get("PYTHONPATH")) if p)
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    env["QWENQUANT_NO_PROGRESS"] = "1"
    env.pop("QWENQUANT_VLLM", None)
    return env
