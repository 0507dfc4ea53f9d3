"""`qwenquant check`: vLLM would load the artifact (the rules are in qwenquant.check)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from qwenquant.commands._app import Activations, app

if TYPE_CHECKING:
    from qwenquant.check import CheckReport
    from qwenquant.check.activations import Int8Check


ArtifactDir = Annotated[
    Path, typer.Argument(exists=True, file_okay=False, help="Artifact folder (config.json + safetensors).")
]
CheckActivations = Annotated[
    Activations | None,
    typer.Option(
        "--activations",
        help="int8: also prove the artifact qualifies for `serve --activations int8` "
        "(symmetric 4-bit group-wise Marlin layers, no negative scale) and count the weight "
        "groups whose scale becomes 0 in vLLM's int16 re-quantization (reads the scales). "
        "Default: int8 when a serve profile of the artifact's recipe asks for it.",
        show_default=False,
    ),
]


@app.command("check")
def check(
    artifact: ArtifactDir,
    as_json: bool = typer.Option(False, "--json", help="Print the findings as JSON."),
    activations: CheckActivations = None,
) -> None:
    """Check that vLLM would load an artifact: fused-layer schemes, kernel shapes, lm_head, MTP, layout.

    Reads config.json, the safetensors index and headers only (fast, no torch); --activations int8 also
    reads the group scales.

    Examples:

      qwenquant check artifacts/q27b

      qwenquant check artifacts/q27b --json

      qwenquant check artifacts/q27b --activations int8
    """
    from qwenquant.check import read_artifact, run_rules
    from qwenquant.check.activations import int8_asked, int8_check
    from qwenquant.console import print_json

    facts = read_artifact(artifact)
    report = run_rules(facts, str(artifact))
    int8 = int8_check(facts, report) if int8_asked(activations.value if activations else None, facts) else None
    if int8 is not None:
        report = int8.report
    if as_json:
        print_json(report.to_dict() | ({"int8_activations": int8.to_dict()} if int8 else {}))
    else:
        _print_report(artifact, report, int8)
    if int8 is not None and int8.warning():
        import logging

        logging.getLogger(__name__).warning("%s", int8.warning())
    if not report.ok:
        raise _refusal(artifact, report.findings)


def _print_report(artifact: Path, report: CheckReport, int8: Int8Check | None) -> None:
    """The text report: one OK line (and the int8 line when it was checked), else a table of the findings."""
    from qwenquant.console import stdout

    if report.ok:
        stdout.print(
            f"OK {artifact}: {report.tensors_checked} tensors, all {len(report.rules_run)} rules pass", markup=False
        )
        if int8 is not None:
            stdout.print(
                f"int8 activations: the artifact qualifies; {int8.int8.zero_groups} of {int8.int8.groups} "
                "weight groups have a scale that becomes 0 in vLLM's int16 re-quantization",
                markup=False,
            )
        return
    from rich.table import Column, Table

    table = Table(
        Column("rule", no_wrap=True),
        Column("where", overflow="fold"),
        "problem",
        "fix",
        title=f"{artifact}: {len(report.findings)} problem{'s' * (len(report.findings) != 1)}",
    )
    for f in report.findings:
        table.add_row(f.rule, f.where, f.message, f.fix)
    stdout.print(table)


def _refusal(artifact: Path, findings: Sequence[Any]) -> Exception:
    """A damaged shard of an artifact (its manifest lists it) is bytes that differ from their record (exit 4),
    named with its problem; anything else is what vLLM would refuse (exit 6)."""
    from qwenquant.errors import CheckError, VerificationError, damaged_file_hint
    from qwenquant.manifest import MANIFEST_NAME

    damaged = [f for f in findings if f.rule == "safetensors-header"]
    if damaged:
        where = "; ".join(f"{artifact / f.where}: {f.message}" for f in damaged[:3]) + (
            " ..." if len(damaged) > 3 else ""
        )
        error = VerificationError if (artifact / MANIFEST_NAME).exists() else CheckError
        return error(f"{where} (the safetensors header cannot be read)", hint=damaged_file_hint(artifact))
    return CheckError(
        f"{artifact}: {len(findings)} problem(s) vLLM would refuse: "
        + "; ".join(f"{f.rule} at {f.where}" for f in findings[:10])
        + (" ..." if len(findings) > 10 else ""),
        hint="fix the recipe or stage named by each rule and rebuild; `--json` lists every finding",
    )
