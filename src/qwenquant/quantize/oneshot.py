"""The gptq stage's `oneshot` engine (QWENQUANT_GPTQ_ENGINE=oneshot): llm-compressor's `oneshot` on the whole
model, saved compressed into a scratch folder. The stage (stages/gptq.py `run_gptq`) then takes every tensor the
recipe does not quantize back from the source bytes (`restore_plan`, docs/known-issues.md#norm-rounding) and
writes the shards itself."""

from __future__ import annotations

import json
import logging
import os
import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qwenquant.checkpoint.names import MTP_PREFIX
from qwenquant.errors import StageError
from qwenquant.modeling.runtime import set_deterministic

if TYPE_CHECKING:
    from qwenquant.recipe import QuantizationSpec

SAVE_DIR = ".llmcompressor-save"  # under the stage's folder, removed once the shards are written


class _LayerCounter:
    """A loguru sink: counts modules llm-compressor reports as quantized, feeds a progress callback
    (modules done, `total`)."""

    _re = re.compile(r"Quantizing (\d+) module")

    def __init__(self, progress: Callable[[int, int], None] | None, total: int) -> None:
        self.progress = progress
        self.total = total
        self.done = 0
        self.log = logging.getLogger("qwenquant.llmcompressor")

    def __call__(self, message: Any) -> None:
        rec = message.record
        text = rec["message"]
        level = logging.WARNING if rec["level"].name in ("WARNING", "ERROR", "CRITICAL") else logging.DEBUG
        self.log.log(level, "%s", text)
        m = self._re.search(text)
        if m:
            self.done += int(m.group(1))
            if self.progress:
                self.progress(self.done, self.total)


def count_targets(model: Any, q: QuantizationSpec) -> int:
    """How many Linear modules the modifier will quantize (for the progress bar)."""
    import torch

    from qwenquant.checkpoint.names import targets_cover

    n = 0
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and not targets_cover(q.ignore, name):
            if name.startswith(MTP_PREFIX):
                continue
            n += 1
    return n


def _load_model(source_dir: Path) -> tuple[Any, Any]:
    """The whole model of `source_dir` (its config's architecture) in eval mode, and its tokenizer. Raises
    StageError."""
    import transformers

    src_cfg = json.loads((source_dir / "config.json").read_text())
    arch = (src_cfg.get("architectures") or ["Qwen3_5ForConditionalGeneration"])[0]
    model_cls = getattr(transformers, arch, None)
    if model_cls is None:
        raise StageError(
            f"transformers has no model class {arch}", hint="upgrade transformers (see constraints/quant.txt)"
        )
    model = model_cls.from_pretrained(str(source_dir), dtype="auto").eval()
    return model, transformers.AutoTokenizer.from_pretrained(str(source_dir))


def oneshot_args(processor: Any, modifier: Any, q: Any, samples: list[list[int]]) -> dict[str, Any]:
    """llm-compressor's `oneshot` arguments besides the model, as this engine runs it (and benchmarks run stock
    oneshot): the calibration ids as a dataset in their order, sequential over the recipe's targets, batch 1."""
    from datasets import Dataset

    ds = Dataset.from_dict({"input_ids": samples, "attention_mask": [[1] * len(s) for s in samples]})
    return {
        "processor": processor,
        "dataset": ds,
        "recipe": modifier,
        "sequential_targets": list(q.sequential_targets),
        "pipeline": "sequential",
        "num_calibration_samples": len(samples),
        "max_seq_length": max(len(s) for s in samples),
        "shuffle_calibration_samples": False,
        "batch_size": 1,
    }


def oneshot_save(
    source_dir: Path,
    samples: list[list[int]],
    q: QuantizationSpec,
    out_dir: Path,
    *,
    device: str,
    progress: Callable[[int, int], None] | None = None,
) -> Path:
    """Quantize the whole model of `source_dir` with llm-compressor's `oneshot` over `samples` and save it
    compressed into `out_dir`/SAVE_DIR (returned); the model is freed before this returns. Raises StageError."""
    os.environ.setdefault("TQDM_DISABLE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # tokenization is done; silences a warning
    set_deterministic()
    import torch
    from loguru import logger as loguru_logger

    from qwenquant.modeling.compat import build_modifier, oneshot

    modifier = build_modifier(q)  # imports llm-compressor, which resets loguru's sinks: before ours is added
    if not q.restore_unquantized:
        raise StageError(
            "quantization.restore_unquantized: false is not supported: llm-compressor 0.14 rounds "
            "offset-norm weights, and every build proves unquantized tensors byte-identical",
            hint="set quantization.restore_unquantized: true (the default)",
        )
    model, tokenizer = _load_model(Path(source_dir))
    counter = _LayerCounter(progress, count_targets(model, q))
    loguru_logger.remove()
    sink = loguru_logger.add(counter, level="DEBUG")
    # transformers warns about offloaded modules on every compressed save; nothing is offloaded here
    warnings.filterwarnings("ignore", message="Attempting to save a model with offloaded modules")
    raw = out_dir / SAVE_DIR
    try:
        oneshot(model=model, **oneshot_args(tokenizer, modifier, q, samples))
        model.save_pretrained(str(raw), save_compressed=True)
    finally:
        loguru_logger.remove(sink)
    del model
    if device == "cuda" and torch.cuda.is_available():
        torch.cuda.empty_cache()
    return raw
