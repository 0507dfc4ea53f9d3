"""The options of `qwenquant eval`'s subcommands, declared once as Annotated aliases and reused by each
subcommand that takes them (the server options are commands/_options.py's, shared with serve and bench)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from qwenquant.commands._app import Activations, Device

_REPORT_WRITE = (
    "Checked before measuring; a write that fails after measuring prints the report and keeps it in the temp folder."
)
Report = Annotated[
    Path | None,
    typer.Option(
        "--report",
        help="Where the JSON report goes (default: beside the --serve artifact; with a URL: nowhere). " + _REPORT_WRITE,
    ),
]
OfflineReportPath = Annotated[
    Path | None,
    typer.Option("--report", help="Where the JSON report goes (default: beside the artifact). " + _REPORT_WRITE),
]
AsJson = Annotated[bool, typer.Option("--json", help="Print the report as JSON on stdout.")]
Reference = Annotated[
    Path,
    typer.Option(
        "--reference",
        exists=True,
        file_okay=False,
        show_default=False,
        help="The bf16 source checkpoint folder: every file the manifest records for the source must match (sha256).",
    ),
]
ReferenceUnverified = Annotated[
    bool,
    typer.Option(
        "--reference-unverified",
        help="Compare against a --reference that is not the manifest's recorded source (the report and output say so).",
    ),
]
Windows = Annotated[int, typer.Option("--windows", help="Held-out windows to evaluate on.")]
WindowLen = Annotated[
    int,
    typer.Option(
        "--window-len",
        help="Tokens per window, up to the model's max_position_embeddings (long windows: --streamed, "
        "--text-set depth or a long --text; the README says what 32K and 128K need).",
    ),
]
Text = Annotated[Path | None, typer.Option("--text", help="Local text file to cut windows from.")]
TextSet = Annotated[
    str | None,
    typer.Option(
        "--text-set",
        help="Pinned Hub text set (evaltext/NAME.yaml or a YAML path), fetched verified and cached. "
        "Default: the tiny reference's held-out text for it, wikitext-2-test for other models; `depth`: the "
        "pinned text of bench depth, for long windows.",
    ),
]
Streamed = Annotated[
    bool | None,
    typer.Option(
        "--streamed/--dense",
        help="Run both arms one decoder layer at a time from the shards (default: streamed above 2 GB of weights).",
    ),
]
OfflineDevice = Annotated[Device, typer.Option("--device", help="cpu or cuda.")]

OfflineActs = Annotated[
    Activations,
    typer.Option(
        "--activations",
        help="int8: also measure the artifact as vLLM runs it with VLLM_MARLIN_INPUT_DTYPE=int8 "
        "(per-token int8 activations, int16 group scales on every int4 Linear), against bf16 and "
        "against the W4A16 artifact.",
    ),
]
Gate = Annotated[
    str, typer.Option("--gate", help="Exact-match gate: a shipped name (`qwenquant eval gates`), a JSON file, or none.")
]
Model = Annotated[str | None, typer.Option("--model", help="Served model name (default: the server's first).")]
MinAcceptance = Annotated[
    float | None,
    typer.Option(
        "--min-acceptance-length",
        help="Fail when MTP mean acceptance length, over every request the run sent, is below this.",
    ),
]
Tools = Annotated[
    bool,
    typer.Option(
        "--tools",
        help="Also send the shipped tool schemas: each answer must be what its tool_choice (auto, required, "
        "none, a named function) allows, every call well formed (arguments a JSON string matching the "
        "schema).",
    ),
]
Needle = Annotated[
    bool,
    typer.Option(
        "--needle",
        help="Also run the shipped needle task: a fact planted at several depths of prompts up to the "
        "server's max_model_len, asked in chat (an instruction-following model); pass/fail per depth.",
    ),
]
NeedleMaxLen = Annotated[
    int | None,
    typer.Option("--needle-max-len", help="Longest needle prompt in tokens (default: the server's max_model_len)."),
]
SpecCheck = Annotated[
    bool,
    typer.Option(
        "--spec-check",
        help="Also hold greedy text with MTP against greedy text without it on prompts of chosen lengths "
        "(1 + k tokens included, k the draft count): the first divergence per prompt is reported, "
        "a divergence fails the run (exit 8). With --serve, eval starts the server without MTP "
        "too; against a URL it needs --reference-url.",
    ),
]
ReferenceUrl = Annotated[
    str | None,
    typer.Option(
        "--reference-url",
        help="--spec-check against a URL: the same model served without speculation (-- --speculative-config null).",
        show_default=False,
    ),
]
DraftTokens = Annotated[
    int | None,
    typer.Option(
        "--draft-tokens",
        min=1,
        help="--spec-check: k, where the drafting server's /metrics cannot say.",
        show_default=False,
    ),
]
SpecTieNats = Annotated[
    float,
    typer.Option(
        "--spec-tie-nats",
        min=0.0,
        help="--spec-check: a divergence where the drafted token lies within this many nats "
        "of the best token (asked of the server without speculation) is a numerical "
        "tie, not a changed answer (set from the CPU build: evaluate/speccheck.py).",
    ),
]
ServedArgs = Annotated[
    list[str] | None,
    typer.Argument(
        help="URL of a running server (its base URL; a trailing /v1 is fine); with --serve: vLLM flags after --.",
        show_default=False,
    ),
]
