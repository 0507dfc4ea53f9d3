"""The options of `qwenquant bench`'s subcommands, declared once as Annotated aliases and reused by each
subcommand that takes them (the server options are commands/_options.py's, shared with serve and eval)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from qwenquant.commands import _options as so
from qwenquant.commands._app import Split
from qwenquant.commands._options import with_options as with_options  # the one group decorator

PANEL = "Measurement"


class Thinking(str, Enum):
    """Which thinking settings to send (`chat_template_kwargs.enable_thinking`)."""

    auto = "auto"  # bench run: off and on where the template reads it; the long modes: off
    both = "both"
    on = "on"
    off = "off"
    default = "default"  # send nothing: the template's default

    def single(self, mode: str = "depth") -> bool | None:
        """The one setting of a long mode (depth, soak, turns): on, default (None), off (auto: off); `both` is two
        settings, which a long mode does not run: a UsageError (exit 2) rather than silently off."""
        if self is Thinking.both:
            from qwenquant.errors import UsageError

            raise UsageError(
                f"--thinking both runs two settings; bench {mode} measures one",
                hint=f"choose --thinking on, off or default for bench {mode} (bench run takes both)",
            )
        return {"on": True, "default": None}.get(self.value, False)


Target = Annotated[
    list[str] | None,
    typer.Argument(help="URL of a running server; with --serve: vLLM flags after --.", show_default=False),
]
Model = Annotated[str | None, typer.Option(help="Model name for a URL (default: the first it lists).")]
Out = Annotated[
    Path | None,
    typer.Option(
        "--out",
        help="JSON file to write (the PNG goes beside it; default qwenquant-bench-<time>.json).",
        show_default=False,
    ),
]
AsJson = Annotated[bool, typer.Option("--json", help="Print the report as JSON on stdout instead of the tables.")]
Config = Annotated[
    Path | None, typer.Option(help="Bench config YAML: workload and too-good lines (default: the shipped one).")
]
ThinkingOpt = Annotated[
    Thinking,
    typer.Option(
        "--thinking",
        help="auto (run: off and on where supported; depth, soak, turns: off), both (run only), on, off, default.",
        rich_help_panel=PANEL,
    ),
]
StallTimeout = Annotated[
    float,
    typer.Option(
        min=0.001,
        help="Seconds without a token from the server (keep-alive comments do not count) that fail a request.",
        rich_help_panel=PANEL,
    ),
]
MaxTokens = Annotated[
    int | None,
    typer.Option(
        min=1, help="Tokens per request (run: the bench config's; depth and turns: 64).", rich_help_panel=PANEL
    ),
]
Streams = Annotated[
    int,
    typer.Option(
        "--concurrency",
        min=1,
        help="Streams at once (at most what the server runs at once: its max-num-seqs).",
        rich_help_panel=PANEL,
    ),
]
# the workload of `bench run` and `bench compare`
Prompts = Annotated[str, typer.Option(help="Prompts to send (comma-separated).", rich_help_panel=PANEL)]
Samplings = Annotated[
    str, typer.Option("--sampling", help="Sampling presets (comma-separated).", rich_help_panel=PANEL)
]
Repeats = Annotated[int | None, typer.Option(min=1, help="Requests per cell per round.", rich_help_panel=PANEL)]
Rounds = Annotated[
    int | None, typer.Option(min=1, help="Rounds (default 1, or the config's for compare).", rich_help_panel=PANEL)
]
MaxConcurrency = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="Top of the concurrency ladder (default: the profile's max-num-seqs; 1 for a URL).",
        rich_help_panel=PANEL,
    ),
]
IgnoreEos = Annotated[
    bool, typer.Option(help="Send ignore_eos so every request generates exactly --max-tokens.", rich_help_panel=PANEL)
]
# one side of `bench compare`
COMPARE = "Configurations A and B (compare)"
Label = Annotated[str | None, typer.Option(help="Name of the configuration in the report.", rich_help_panel=COMPARE)]
SideUrl = Annotated[
    str | None, typer.Option(help="A running server for this configuration (no --serve).", rich_help_panel=COMPARE)
]
SideProfile = Annotated[
    str | None, typer.Option(help="Serve profile of this configuration (default: --profile).", rich_help_panel=COMPARE)
]
SideGpuMem = Annotated[
    str | None, typer.Option(help="--gpu-mem of this configuration (default: --gpu-mem).", rich_help_panel=COMPARE)
]
SideSplit = Annotated[
    Split | None,
    typer.Option(help="--split of this configuration (default: --split).", rich_help_panel=COMPARE, show_default=False),
]
SideVllm = Annotated[
    list[str] | None,
    typer.Option(
        help="A vLLM flag or value of this configuration only, one per option, passed to vLLM as given "
        "(`--vllm-arg-b=--speculative-config --vllm-arg-b=null`).",
        rich_help_panel=COMPARE,
        show_default=False,
    ),
]


@dataclass(frozen=True)
class Server(so.ServerOptions):
    """Which server every subcommand measures: a URL's model and key, or the artifact --serve starts, with
    serve's options (commands/_options.py ServerOptions)."""

    serve: so.ServeArtifact = None
    model: Model = None


@dataclass(frozen=True)
class Workload:
    """The workload of `bench run` and `bench compare`."""

    config: Config = None
    prompts: Prompts = "narrative,code,quote"
    sampling: Samplings = "greedy,sampled"
    thinking: ThinkingOpt = Thinking.auto
    max_tokens: MaxTokens = None
    repeats: Repeats = None
    rounds: Rounds = None
    max_concurrency: MaxConcurrency = None
    ignore_eos: IgnoreEos = True
    stall_timeout: StallTimeout = 300.0
