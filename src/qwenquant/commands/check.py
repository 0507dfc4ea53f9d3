"""`qwenquant check`: vLLM would load the artifact (the rules are in qwenquant.check)."""

from __future__ import annotations

from pathlib import Path

import typer

from qwenquant.commands._app import app


@app.command("check")
def check(
    artifact: Path = typer.Argument(..., exists=True, file_okay=False, help="Artifact folder (config.json + safetensors)."),
    as_json: bool = typer.Option(False, "--json", help="Print the findings as JSON."),
) -> None:
    """Check that vLLM would load an artifact: fused-layer schemes, kernel shapes, lm_head, MTP, layout.

    Reads config.json, the safetensors index and headers only (fast, no torch).

    Examples:

      qwenquant check artifacts/q27b

      qwenquant check artifacts/q27b --json
    """
    from qwenquant.check import check_artifact
    from qwenquant.console import print_json, stdout
    from qwenquant.errors import CheckError

    report = check_artifact(artifact)
    if as_json:
        print_json(report.to_dict())
    elif report.ok:
        stdout.print(f"OK {artifact}: {report.tensors_checked} tensors, all {len(report.rules_run)} rules pass",
                     markup=False)
    else:
        from rich.table import Column, Table

        table = Table(Column("rule", no_wrap=True), Column("where", overflow="fold"), "problem", "fix",
                      title=f"{artifact}: {len(report.findings)} problems")
        for f in report.findings:
            table.add_row(f.rule, f.where, f.message, f.fix)
        stdout.print(table)
    if not report.ok:
        raise CheckError(
            f"{artifact}: {len(report.findings)} problem(s) vLLM would refuse: "
            + "; ".join(f"{f.rule} at {f.where}" for f in report.findings[:10])
            + (" ..." if len(report.findings) > 10 else ""),
            hint="fix the recipe or stage named by each rule and rebuild; `--json` lists every finding",
        )
