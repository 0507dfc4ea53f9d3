"""The shared typer app that every command module registers on, and the option value sets they share."""

from __future__ import annotations

from enum import Enum

import typer


class Device(str, Enum):
    """Where quantize computes and what a vLLM build targets."""

    cpu = "cpu"
    cuda = "cuda"


class HessianPrecision(str, Enum):
    """How quantize accumulates GPTQ Hessians (recipe key quantization.hessian_precision)."""

    tensor_core = "tensor-core"
    fp32 = "fp32"


class RepoType(str, Enum):
    """The kinds of Hub repo `qwenquant fetch` downloads."""

    model = "model"
    dataset = "dataset"

# The one table of exit codes (README "Exit codes" repeats it; tests/unit/test_cli_help.py checks both).
EXIT_CODES = (
    (0, "success"),
    (1, "unexpected error (a bug or an input nothing checks yet)"),
    (2, "usage: a wrong option or argument, an invalid recipe or calibration file"),
    (3, "fetch: the Hub repo, a download or a safetensors file could not be trusted"),
    (4, "verification: files differ from their manifest or fetch record"),
    (5, "a quantize or graft-mtp stage failed, or an output folder holds files qwenquant did not write"),
    (6, "check: vLLM would refuse the artifact"),
    (7, "serve/plan: the server did not start or stay healthy, or the memory budget does not fit"),
    (8, "bench/eval: a measurement could not be made, or a quality gate failed"),
    (130, "interrupted (Ctrl-C)"),
)

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
    epilog=(
        "Errors print one line and a hint; an unexpected error's traceback goes to the crash file the hint "
        "names (QWENQUANT_DEBUG=1 prints it too). Exit codes:\n\n"
        + "\n\n".join(f"  {code:>3}  {kind}" for code, kind in EXIT_CODES)
    ),
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    rich_markup_mode="rich",
    add_completion=False,
)
