"""`qwenquant verify`: the bytes of an artifact match its manifest (and, when asked, its signature)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from qwenquant.commands._app import app

if TYPE_CHECKING:
    from qwenquant.signing import Signed

ManifestedArtifact = Annotated[
    Path, typer.Argument(exists=True, file_okay=False, help="Artifact folder holding qwenquant-manifest.json.")
]
Signature = Annotated[
    Path | None, typer.Option("--signature", help="A model_signing signature (model.sig) to check too.")
]
PublicKey = Annotated[
    Path | None, typer.Option("--public-key", help="The signer's public key (PEM), with --signature.")
]


@app.command("verify")
def verify(
    artifact: ManifestedArtifact,
    signature: Signature = None,
    public_key: PublicKey = None,
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Re-hash every file of an artifact against its manifest; exit 0 only when all match. A fetched
    folder's card files are checked against its card record, and the published root digest is named.

    Examples:

      qwenquant verify artifacts/q27b

      qwenquant verify models/q27b --signature models/q27b/model.sig --public-key publisher.pub

      qwenquant verify artifacts/q27b --json | jq .problems
    """
    from qwenquant.console import print_json, stdout
    from qwenquant.errors import UsageError, VerificationError
    from qwenquant.publish.cardcheck import verify_published_artifact

    if (signature is None) != (public_key is None):
        raise UsageError(
            "--signature and --public-key go together",
            hint="qwenquant verify DIR --signature DIR/model.sig --public-key publisher.pub",
        )
    report = verify_published_artifact(artifact)
    signed = None
    if report.ok and signature is not None and public_key is not None:  # both or neither (checked above)
        from qwenquant.signing import verify_signature

        signed = verify_signature(artifact, signature, public_key)
    if as_json:
        print_json({**report.to_dict(), "signature": _signature_json(signature, signed)})
    elif report.ok:
        stdout.print(
            f"OK {artifact}: {report.files_checked} files, {report.bytes_checked} bytes, "
            f"root sha256:{report.root_digest}",
            markup=False,
        )
        for line in _provenance(artifact, report, signature, public_key, signed):
            stdout.print(line, markup=False)
    else:
        _problem_table(artifact, report, stdout)
    if not report.ok:
        raise VerificationError(
            f"{artifact} does not match its manifest: " + ", ".join(_problem_text(p) for p in report.problems),
            hint=_hint(artifact, report),
        )


def _signature_json(signature: Path | None, signed: Signed | None) -> dict[str, Any] | None:
    """The --json report's `signature`: the signature checked and what it covers (None: none was checked)."""
    if signed is None:
        return None
    return {
        "path": str(signature),
        "files": signed.files,
        "covers": signed.covers(),
        "card_files": list(signed.card_files),
    }


def _problem_text(p: Any) -> str:
    """One mismatching file in the error line: its path and status (a card file's detail too)."""
    return f"{p.path} ({p.status}{': ' + p.detail if p.status == 'card' else ''})"


def _hint(artifact: Path, report: Any) -> str:
    """Card problems: the card was changed after publishing (fetch it again, from the repo the fetch record
    names); files: re-copy or rebuild."""
    if all(p.status == "card" for p in report.problems):
        return (
            "the card files differ from what the manifest and the reports give (edited after publishing): "
            f"re-fetch the folder (`qwenquant fetch {_fetched_from(artifact) or 'REPO'} --out {artifact}`); "
            "never trust figures that fail this"
        )
    return "re-copy or rebuild the artifact; never serve files that fail verification"


def _fetched_from(artifact: Path) -> str | None:
    """The repo id the folder's fetch record names (None: not a fetched folder)."""
    import json

    from qwenquant.manifest import FETCH_RECORD_NAME

    try:
        return str(json.loads((artifact / FETCH_RECORD_NAME).read_text())["repo_id"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _provenance(artifact: Path, report: Any, signature: Path | None, public_key: Path | None, signed: Any) -> list[str]:
    """Where a fetched folder came from, the published root digest, the signature that held."""
    import json

    from qwenquant.manifest import FETCH_RECORD_NAME

    out = []
    if report.card:
        out.append(
            f"published as {report.published_as}: root digest {report.card['root_digest']} "
            f"(card and {len(report.card['files']) - 1} reports unchanged since publishing)"
        )
    try:
        rec = json.loads((artifact / FETCH_RECORD_NAME).read_text())
        out.append(f"fetched from {rec['repo_id']}@{rec['commit']} ({rec.get('endpoint')})")
    except (OSError, ValueError, KeyError, TypeError):
        pass
    if signed is not None:
        out.append(f"signature {signature}: valid for {public_key} over {signed.files} signed files: {signed.covers()}")
    return out


def _problem_table(artifact: Path, report: Any, out: Any) -> None:
    from rich.table import Column, Table

    width = max(len(p.path) for p in report.problems)  # never wrap a file name: users grep for it
    table = Table(
        Column("file", no_wrap=True, min_width=width),
        "size",
        "status",
        "detail",
        title=f"{artifact}: {len(report.problems)} problem{'s' * (len(report.problems) != 1)}",
    )
    for p in report.problems:
        size = p.actual_size if p.actual_size is not None else p.expected_size
        table.add_row(p.path, "" if size is None else str(size), p.status, p.detail)
    out.print(table)
