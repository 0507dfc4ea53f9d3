"""qwenquant: reproducible, verifiable int4 quantization and vLLM serving of Qwen3.5-architecture models."""

__version__ = "0.1.0"
