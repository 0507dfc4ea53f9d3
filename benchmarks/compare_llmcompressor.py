"""The llm-compressor arm of quantize_bench.py: plain `oneshot` + `save_pretrained` on the same files.

Same source checkpoint, same scheme (the recipe's GPTQModifier), same ignore list, same calibration
tokens (read from the qwenquant run's calibration stage), batch 1, sequential pipeline over
Qwen3_5DecoderLayer, as llm-compressor's own examples run it. Measures wall time of oneshot and of
the save, per-decoder-layer time (time between the first calibration calls of consecutive layers),
peak host RSS and peak GPU memory (torch allocator).
"""

from __future__ import annotations

import itertools
import shutil
import time
from pathlib import Path
from typing import Any


def run_oneshot_arm(
    source: Path, tokens_dir: Path, recipe: Any, out: Path, gpu: Any, rss: Any, say: Any
) -> dict[str, Any]:
    """Run the arm; return its measurements (the caller prints the ratios)."""
    import torch
    import transformers
    from llmcompressor import oneshot

    from qwenquant.modeling.compat import build_modifier
    from qwenquant.modeling.runtime import set_deterministic
    from qwenquant.quantize.oneshot import oneshot_args
    from qwenquant.quantize.stages import calibration as cal

    set_deterministic()
    samples = cal.load_tokens(tokens_dir)
    q = recipe.quantization
    gpu.take(), rss.take()
    t0 = time.perf_counter()
    model = transformers.Qwen3_5ForConditionalGeneration.from_pretrained(str(source), dtype="auto").eval()
    starts: list[float] = []
    for layer in model.model.language_model.layers:

        def first(mod: Any, args: Any, state: dict = {"seen": False}) -> None:  # noqa: B006 (per-hook state)
            if not state["seen"] and isinstance(args[0], torch.Tensor) and args[0].device.type != "meta":
                state["seen"] = True
                starts.append(time.perf_counter())
                say(f"    oneshot layer {len(starts) - 1} starts (t={time.perf_counter() - t0:.0f} s)")

        layer.register_forward_pre_hook(first)
    load_s = time.perf_counter() - t0
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(source))
    oneshot(model=model, **oneshot_args(tokenizer, build_modifier(q), q, samples))
    t1 = time.perf_counter()
    model.save_pretrained(str(out), save_compressed=True)
    t2 = time.perf_counter()
    per_layer = [b - a for a, b in itertools.pairwise(starts)]
    result = {
        "load_seconds": load_s,
        "oneshot_seconds": t1 - t0 - load_s,
        "save_seconds": t2 - t1,
        "wall_seconds": t2 - t0,
        "per_layer_seconds": per_layer,
        "median_layer_seconds": sorted(per_layer)[len(per_layer) // 2] if per_layer else None,
        "peak_gpu_bytes": gpu.take(),
        "peak_rss_bytes": rss.take(),
    }
    del model
    shutil.rmtree(out, ignore_errors=True)
    return result


def ratios(qq: dict[str, Any], lc: dict[str, Any]) -> dict[str, float | None]:
    """qwenquant / llm-compressor for each figure (below 1: qwenquant is faster or smaller)."""

    def r(a: float | None, b: float | None) -> float | None:
        return a / b if a and b else None

    return {
        "median_layer_seconds": r(qq.get("median_layer_seconds"), lc["median_layer_seconds"]),
        "wall_seconds": r(qq.get("wall_seconds"), lc["wall_seconds"]),
        "peak_rss_bytes": r(qq.get("peak_rss_bytes"), lc["peak_rss_bytes"]),
        "peak_gpu_bytes": r(qq.get("peak_gpu_bytes"), lc["peak_gpu_bytes"]),
    }
