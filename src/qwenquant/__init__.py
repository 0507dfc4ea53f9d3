"""qwenquant: reproducible, verifiable int4 quantization and vLLM serving of Qwen3.5-architecture models."""

from __future__ import annotations

from pathlib import Path

__version__ = "0.1.0"


def data_path(*parts: str) -> Path:
    """A file or folder of the data shipped in the package (`qwenquant/data/`: recipes, calibration and
    eval text sets, the tiny reference model), found through importlib.resources: a wheel installed
    anywhere finds it as a checkout does."""
    from importlib import resources

    found = resources.files(__name__) / "data"
    for part in parts:
        found = found / part
    return Path(str(found))
