"""`qwenquant verify`: the bytes of an artifact match its manifest."""

from __future__ import annotations

from pathlib import Path

import typer

from qwenquant.commands._app import app


@app.command("verify")
def verify(
    artifact: Path = typer.Argument(..., help="Artifact folder holding qwenquant-manifest.json."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Re-hash every file of an artifact against its manifest; exit 0 only when all match.

    Examples:

      qwenquant verify artifacts/q27b

      qwenquant verify artifacts/q27b --json | jq .problems
    """
    from qwenquant.console import print_json, stdout
    from qwenquant.errors import VerificationError
    from qwenquant.manifest import verify_artifact

    report = verify_artifact(artifact)
    if as_json:
        print_json(report.to_dict())
    elif report.ok:
        stdout.print(f"OK {artifact}: {report.files_checked} files, {report.bytes_checked} bytes, "
                     f"root sha256:{report.root_digest}", markup=False)
    else:
        from rich.table import Column, Table

        width = max(len(p.path) for p in report.problems)  # never wrap a file name: users grep for it
        table = Table(Column("file", no_wrap=True, min_width=width), "size", "status", "detail",
                      title=f"{artifact}: {len(report.problems)} problems")
        for p in report.problems:
            size = p.actual_size if p.actual_size is not None else p.expected_size
            table.add_row(p.path, "" if size is None else str(size), p.status, p.detail)
        stdout.print(table)
    if not report.ok:
        raise VerificationError(
            f"{artifact} does not match its manifest: " + ", ".join(
                f"{p.path} ({p.status})" for p in report.problems),
            hint="re-copy or rebuild the artifact; never serve files that fail verification",
        )
