"""The shared typer app that every command module registers on, and the option value sets they share."""

from __future__ import annotations

from enum import Enum

import typer


class Device(str, Enum):
    """Where quantize computes and what a vLLM build targets."""

    cpu = "cpu"
    cuda = "cuda"


class RepoType(str, Enum):
    """The kinds of Hub repo `qwenquant fetch` downloads."""

    model = "model"
    dataset = "dataset"


app = typer.Typer(
    name="qwenquant",
    help=(
        "Reproducible, verifiable int4 quantization and vLLM serving of Qwen3.5-architecture "
        "models (Qwen3.8-27B on one 24 GB GPU).\n\n"
        "Pipeline: fetch -> quantize -> verify -> serve.\n\n"
        "Examples:\n\n"
        "  qwenquant fetch Qwen/Qwen3.8-27B --revision main --out models/Qwen3.8-27B\n\n"
        "  qwenquant quantize models/Qwen3.8-27B --recipe w4a16-int4head --out artifacts/q27b\n\n"
        "  qwenquant verify artifacts/q27b\n\n"
        "  qwenquant serve artifacts/q27b --profile single-user"
    ),
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    rich_markup_mode="rich",
    add_completion=False,
)
