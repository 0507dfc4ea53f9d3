"""The shared typer app that every command module registers on, and the option value sets they share."""

from __future__ import annotations

from enum import Enum
from typing import Any

import typer

from qwenquant.serve.topology import Split as Split  # the one value set of --split (serve, bench, eval, plan)


class Device(str, Enum):
    """Where quantize computes and what a vLLM build targets."""

    cpu = "cpu"
    cuda = "cuda"


class Activations(str, Enum):
    """The activations vLLM's Marlin kernel takes for W4A16 layers (serve --activations)."""

    bf16 = "bf16"
    int8 = "int8"


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
    (130, "interrupted (Ctrl-C; 143: SIGTERM, with the same line)"),
)

# One rule per kind of mistake (README "Exit codes" repeats it; tests/integration/test_careless_inputs.py
# runs a row of careless inputs for each over every command).
EXIT_RULES = (
    (
        "usage",
        2,
        "an option or argument that cannot be used: a path that does not exist (or a file where a folder "
        "is asked, or an empty folder where an artifact is), a number or port out of range, a URL without "
        "http(s)://, a size that cannot be read, an option that needs a GPU (or more GPUs, or a newer one) "
        "than this machine or vLLM build has",
    ),
    (
        "input-file",
        2,
        "a file you give qwenquant to read is invalid (recipe, calibration definition or data, gate, "
        "--text, a config.json to plan for), or an output path cannot be written (another qwenquant "
        "command is writing it too), holds another run's report, or would harm other data (inside "
        "another artifact or the source, --work equal to --out)",
    ),
    ("download", 3, "fetch: the Hub, a download or a safetensors file could not be trusted"),
    (
        "record",
        4,
        "bytes on disk differ from their record: an artifact from its manifest (a missing or damaged shard "
        "too), a fetched folder from its fetch record, a --source/--reference from the source the manifest "
        "records",
    ),
    (
        "stage",
        5,
        "a folder that exists cannot be used as a source (damaged, unsupported, config sizes missing), a "
        "stage failed, the disk is too small, or an output folder holds files qwenquant did not write",
    ),
    ("check", 6, "check: vLLM would refuse the artifact"),
    ("serve", 7, "serve/plan: the server did not start or stay healthy, or the memory budget does not fit"),
    ("measure", 8, "bench/eval: a measurement could not be made, or a quality gate failed"),
)
EXIT_RULE = {kind: code for kind, code, _ in EXIT_RULES}

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


# Ctrl-C: the one line cli.main prints before exit 130, saying what the command did and did not do.
# A command that writes registers its own (`on_interrupt`); these are for the commands that only read
# and for fetch, whose finished files stay verified on disk.
_READ_ONLY = "interrupted: {command} stopped before it reported; it only reads, so nothing was written or changed"
# bench and eval write their report once the measurement is whole; a server --serve started goes with them
_MEASURING = (
    "interrupted: {command} stopped before its report: nothing was written, the figures measured so far "
    "are not kept, and a server that --serve started is stopped with it"
)
INTERRUPT_NOTES = {
    "verify": _READ_ONLY,
    "check": _READ_ONLY,
    "plan": _READ_ONLY,
    "recipe": _READ_ONLY,
    "doctor": _READ_ONLY,
    "fetch": (
        "interrupted: the files fetched and verified so far stay in the --out folder, the rest were not "
        "fetched; re-run the same command to fetch only the rest"
    ),
    "serve": "interrupted before the server started: nothing was started or written",
    "bench": _MEASURING,
    "eval": _MEASURING,
}
_interrupt: dict[str, object] = {}


def on_interrupt(note: object) -> None:
    """Register what Ctrl-C leaves for the running command: a callable returning one line (called
    only when it happens, so it can look at the disk then)."""
    _interrupt["note"] = note


def one_line_summaries(typer_app: typer.Typer) -> None:
    """Each command's line in `qwenquant --help`: its help's first paragraph as one line, which rich wraps to
    the terminal (the docstring's own line breaks would otherwise break it mid-sentence)."""
    import inspect

    for group in typer_app.registered_groups:  # bench, eval, recipe: their subcommands too
        if group.typer_instance is not None:
            one_line_summaries(group.typer_instance)
    infos: list[Any] = [*typer_app.registered_commands, *typer_app.registered_groups]
    for info in infos:
        if info.short_help:
            continue
        text = (
            info.help
            or (info.typer_instance.info.help if getattr(info, "typer_instance", None) else None)
            or inspect.getdoc(info.callback)
            or ""
        )
        first = text.strip().split("\n\n", 1)[0]
        if first:
            info.short_help = " ".join(first.split())


def started(command: str | None) -> None:
    """The root callback names the command that runs (its default interrupt line)."""
    _interrupt.clear()
    _interrupt["command"] = command


def interrupt_line() -> str:
    """The line for Ctrl-C now: the running command's own, its default, or plain "interrupted"."""
    note = _interrupt.get("note")
    if callable(note):
        try:
            return str(note())
        except (OSError, ValueError):  # the disk it looks at is gone: still one line
            pass
    command = str(_interrupt.get("command") or "")
    return INTERRUPT_NOTES.get(command, "interrupted").format(command=f"qwenquant {command}")
