"""`qwenquant publish`: the verified artifact and its model card to a Hub repo, in one commit."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from qwenquant.commands._app import app

if TYPE_CHECKING:
    from qwenquant.publish.run import PublishResult


@app.command(
    epilog=(
        "Examples:\n\n"
        "  qwenquant publish artifacts/q27b --repo me/Qwen3.8-27B-w4a16 --dry-run\n\n"
        "  qwenquant publish artifacts/q27b --repo me/Qwen3.8-27B-w4a16 --report q27b-bench.json\n\n"
        "  qwenquant publish artifacts/q27b --repo me/Qwen3.8-27B-w4a16 --private --sign-key publisher.pem --json"
    )
)
def publish(
    artifact: Path = typer.Argument(
        ..., exists=True, file_okay=False, help="Artifact folder holding qwenquant-manifest.json."
    ),
    repo: str = typer.Option(..., "--repo", help="Hub repo OWNER/NAME (created when missing)."),
    revision: str = typer.Option(
        "main", "--revision", "-r", help="Branch to commit to (created from main when missing)."
    ),
    private: bool = typer.Option(
        False, "--private", help="Create the repo private (an existing repo keeps its visibility)."
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Verify, build the card, list what would be uploaded; no network."
    ),
    report: list[Path] | None = typer.Option(
        None,
        "--report",
        help="A `qwenquant eval` or `bench` JSON of this artifact for the card (repeatable); the eval reports beside the artifact are found.",
    ),
    license_id: str | None = typer.Option(
        None, "--license", help="License id for the card (default: the source's README front matter)."
    ),
    sign_key: Path | None = typer.Option(
        None,
        "--sign-key",
        help="Sign the manifest's files with this EC private key (PEM) via model_signing (pip install 'qwenquant\\[sign]').",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the result (files, plan, commit, card) as JSON."),
) -> None:
    """Upload exactly the manifest's files plus the model card (README.md, its record and the reports)
    in one commit; a re-run of the same artifact is a no-op. Refuses an artifact that does not verify;
    the token is the Hub client's (HF_TOKEN or `hf auth login`)."""
    from qwenquant.console import console, print_json, stdout
    from qwenquant.publish.run import publish_artifact

    r = publish_artifact(
        artifact,
        repo,
        revision=revision,
        private=private,
        dry_run=dry_run,
        reports=report or (),
        license_id=license_id,
        sign_key=sign_key,
    )
    if r.commit and not r.dry_run:  # a Ctrl-C from here on says the job is done (cli.main: exit 0 once it returned)
        from qwenquant.commands._app import on_interrupt

        on_interrupt(
            lambda: (
                f"interrupted after publishing: {repo}@{revision} is at commit {r.commit}, which holds "
                "this artifact; nothing is left to do"
            )
        )
    for w in r.warnings:
        console.print(f"[yellow]warning:[/] {w}", markup=True, highlight=False)
    if as_json:
        print_json(r.record().to_json())
    else:
        _render(r, artifact, stdout)


def _render(r: PublishResult, artifact: Path, out: Any) -> None:
    """The human summary: the dry-run listing and card head, a no-op, or the commit and its URL."""
    repo, revision = r.repo_id, r.revision
    if r.dry_run:
        out.print(
            f"dry run: would publish {artifact} to {repo}@{revision} ({len(r.files)} files, "
            f"{sum(f.size for f in r.files)} bytes, root digest {r.root_digest}):",
            markup=False,
        )
        for f in r.files:
            out.print(f"  {f.path}  {f.size}  sha256:{f.sha256[:16]}", markup=False)
        if r.sign:
            out.print("  model.sig  (signed with --sign-key at upload)", markup=False)
        out.print("card (README.md), first lines:\n" + "\n".join(f"  | {line}" for line in r.card.head()), markup=False)
        out.print("no Hub contacted; a real run sends only what the revision does not hold yet", markup=False)
    elif r.noop:
        out.print(
            f"{repo}@{revision} (commit {r.commit}) already holds exactly this artifact "
            f"(root digest {r.root_digest}): nothing uploaded",
            markup=False,
        )
    else:
        p = r.plan
        assert p is not None, "a publish that committed has its upload plan"
        out.print(
            f"published {artifact} to {repo}@{revision}: commit {r.commit} ({len(p.upload)} files uploaded, "
            f"{len(p.unchanged)} already there, {len(p.delete)} deleted; root digest {r.root_digest})",
            markup=False,
        )
        out.print(f"url: {r.url}", markup=False)
