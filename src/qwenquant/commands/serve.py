"""`qwenquant serve` (light imports; the work is in qwenquant.serve)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from qwenquant.commands._app import app
from qwenquant.commands._options import ServerOptions, with_options

QuantizedArtifact = Annotated[
    Path, typer.Argument(exists=True, file_okay=False, help="Artifact folder made by `qwenquant quantize`.")
]
VllmFlags = Annotated[list[str] | None, typer.Argument(help="Extra vLLM flags, after `--`.", show_default=False)]
Port = Annotated[int | None, typer.Option(min=1, max=65535, help="Port (default: the profile's).")]
Host = Annotated[str | None, typer.Option(help="Host to bind (default: the profile's).")]
ServedModelName = Annotated[str | None, typer.Option(help="Model name clients use.")]
DryRun = Annotated[bool, typer.Option("--dry-run", help="Print the command and environment; start nothing.")]
DryRunJson = Annotated[
    bool,
    typer.Option(
        "--json",
        help="With --dry-run: the decided launch (argv, environment, "
        "memory budget, warnings, failed checks) as JSON on stdout.",
    ),
]
LogFile = Annotated[
    Path | None,
    typer.Option(
        help="Server log (default: ARTIFACT.work/serve/ when quantize left that folder, else a temp folder; never in the artifact).",
    ),
]
RequireSignature = Annotated[
    Path | None,
    typer.Option(
        "--require-signature",
        metavar="PUBLIC_KEY",
        help="Refuse to serve unless the artifact's model_signing signature "
        "holds for this public key (PEM); pip install 'qwenquant\\[sign]'.",
    ),
]
Signature = Annotated[
    Path | None,
    typer.Option("--signature", help="The signature to check with --require-signature (default: ARTIFACT/model.sig)."),
]


@app.command(context_settings={"allow_interspersed_args": True})
@with_options("server", ServerOptions)
def serve(
    artifact: QuantizedArtifact,
    extra: VllmFlags = None,
    *,
    server: ServerOptions,
    port: Port = None,
    host: Host = None,
    served_model_name: ServedModelName = None,
    dry_run: DryRun = False,
    as_json: DryRunJson = False,
    log_file: LogFile = None,
    public_key: RequireSignature = None,
    signature: Signature = None,
) -> int:
    """Serve an artifact with vLLM after preflight checks; print "ready URL" once it answers.

    Examples:

      qwenquant serve artifacts/q27b --profile single-user

      qwenquant serve artifacts/q27b --profile batch --port 8001 -- --max-num-seqs 8

      qwenquant serve artifacts/q27b --profile single-user --dry-run

      qwenquant serve artifacts/q27b --dry-run --json | jq .command

      qwenquant serve artifacts/q27b --gpus 2 --gpu-mem 24GiB   # two 24 GB cards, split by their link

      qwenquant serve artifacts/q27b --gpus 2 --split pipeline --dry-run   # the argv, a stage per card

      qwenquant serve artifacts/q27b --profile single-user --gpu-mem 24GiB   # a 24 GB card on a bigger GPU

      qwenquant serve models/q27b --require-signature publisher.pub   # a downloaded, signed artifact

      qwenquant serve artifacts/q27b --profile batch --activations int8 --dry-run   # int8 activations, checked

      qwenquant serve artifacts/q27b --profile long-context-max   # 204,800 tokens on 24 GB: the table on the host

      qwenquant serve artifacts/q27b --profile long-context --host-embeddings -- --max-model-len 131072
    """
    from qwenquant.serve.run import run_serve

    _refuse_lone_options(artifact, as_json=as_json, dry_run=dry_run, signature=signature, public_key=public_key)
    req = server.to_request(
        artifact,
        extra or [],
        port=port,
        host=host,
        served_model_name=served_model_name,
        dry_run=dry_run,
        log_file=log_file,
        public_key=public_key,
        signature=signature,
    )
    return run_serve(req, as_json=as_json)


def _refuse_lone_options(
    artifact: Path, *, as_json: bool, dry_run: bool, signature: Path | None, public_key: Path | None
) -> None:
    """--json needs --dry-run, and --signature needs --require-signature (a usage error, exit 2)."""
    from qwenquant.errors import UsageError

    if as_json and not dry_run:
        raise UsageError(
            "--json goes with --dry-run (a running server prints `ready URL`)",
            hint=f"qwenquant serve {artifact} --dry-run --json",
        )
    if signature is not None and public_key is None:
        raise UsageError(
            "--signature needs --require-signature PUBLIC_KEY",
            hint=f"qwenquant serve {artifact} --require-signature publisher.pub",
        )
