"""`qwenquant serve` (light imports; the work is in qwenquant.serve)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from qwenquant.commands._app import Device, app


@app.command(context_settings={"allow_interspersed_args": True})
def serve(
    artifact: Path = typer.Argument(..., help="Artifact folder made by `qwenquant quantize`."),
    extra: Optional[list[str]] = typer.Argument(None, help="Extra vLLM flags, after `--`.", show_default=False),
    profile: list[str] = typer.Option([], "--profile", "-p", help="Serve profile from the recipe: single-user (default) or batch."),
    port: Optional[int] = typer.Option(None, help="Port (default: the profile's)."),
    host: Optional[str] = typer.Option(None, help="Host to bind (default: the profile's)."),
    api_key: Optional[str] = typer.Option(None, envvar="QWENQUANT_API_KEY", help="API key clients must send."),
    served_model_name: Optional[str] = typer.Option(None, help="Model name clients use."),
    vllm: Optional[str] = typer.Option(None, help="vLLM to run: a python, a vllm executable or qwenquant-vllm.json."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the command and environment; start nothing."),
    timeout: float = typer.Option(900.0, help="Seconds the server may take to become ready."),
    device: Optional[Device] = typer.Option(None, help="cuda or cpu (default: what the vLLM build targets)."),
    log_file: Optional[Path] = typer.Option(None, help="Server log (default: a temp file, never in the artifact)."),
    gpus: int = typer.Option(1, "--gpus", "--tensor-parallel-size", min=1,
                             help="GPUs to split the model over (vLLM tensor parallelism); each must be free."),
    gpu_mem: Optional[str] = typer.Option(None, "--gpu-mem", help="Behave as on a card of this size, e.g. 24GiB: "
                                          "sets vLLM's memory share of the real GPU (CUDA only)."),
) -> int:
    """Serve an artifact with vLLM after preflight checks; print "ready URL" once it answers.

    Examples:

      qwenquant serve artifacts/q27b --profile single-user

      qwenquant serve artifacts/q27b --profile batch --port 8001 -- --max-num-seqs 8

      qwenquant serve artifacts/q27b --profile single-user --dry-run

      qwenquant serve artifacts/q27b --gpus 2 --gpu-mem 24GiB   # two 24 GB cards, tensor parallel

      qwenquant serve artifacts/q27b --profile single-user --gpu-mem 24GiB   # a 24 GB card on a bigger GPU
    """
    from qwenquant.serve.run import run_serve

    return run_serve(artifact, profile, extra or [], port=port, host=host, api_key=api_key,
                     served_model_name=served_model_name, vllm=vllm, dry_run=dry_run, timeout=timeout,
                     device=device.value if device else None, log_file=log_file, tp=gpus, gpu_mem=gpu_mem)
