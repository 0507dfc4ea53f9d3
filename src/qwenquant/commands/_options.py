"""The server options `serve`, `bench --serve` and `eval --serve` share, declared once
(huggingface_hub's cli/_cli_utils.py aliases are the model): the same names, defaults and help
everywhere, listed in one help panel. Each command turns them into one ServeRequest
(qwenquant.serve.request) and hands that down.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from qwenquant.commands._app import Activations, Device, Split
from qwenquant.serve.request import DEFAULT_TIMEOUT

__all__ = ["DEFAULT_TIMEOUT", "PANEL", "Acts", "ApiKey", "GpuMem", "GpuMemSoft", "Gpus", "Profiles", "ServeArtifact", "ServeDevice",
           "ServeSplit", "Timeout", "Vllm"]

PANEL = "Server (serve; bench and eval with --serve)"

ServeArtifact = Annotated[Path | None, typer.Option(
    "--serve", exists=True, file_okay=False, help="Artifact to serve through `qwenquant serve`'s preflight and supervisor for the run, "
                    "stopped after it.", rich_help_panel=PANEL)]
Profiles = Annotated[list[str] | None, typer.Option(
    "--profile", "-p", help="Serve profile from the recipe: single-user (default), batch or long-context.",
    rich_help_panel=PANEL, show_default=False)]
GpuMem = Annotated[str | None, typer.Option(
    "--gpu-mem", help="Behave as on a card of this size, e.g. 24GiB: sets vLLM's memory share of the real GPU "
                      "(CUDA only), and a ballast process holds the rest of it (see --gpu-mem-soft).",
    rich_help_panel=PANEL)]
GpuMemSoft = Annotated[bool, typer.Option(
    "--gpu-mem-soft", help="With --gpu-mem: only vLLM's budget, no hard limit (no ballast holding the rest of the "
                           "GPU).", rich_help_panel=PANEL)]
Gpus = Annotated[int, typer.Option(
    "--gpus", "--tensor-parallel-size", min=1,
    help="GPUs to split the model over (see --split); each must be free.", rich_help_panel=PANEL)]
ServeSplit = Annotated[Split | None, typer.Option(
    "--split", help="With --gpus N: tensor (vLLM tensor parallelism: every layer over all GPUs) or pipeline "
                    "(--pipeline-parallel-size: each GPU a run of whole layers). Default: tensor when the GPUs share "
                    "NVLink or peer-to-peer PCIe (nvidia-smi topo), else pipeline; the choice and its reason are "
                    "printed.", rich_help_panel=PANEL, show_default=False)]
Vllm = Annotated[str | None, typer.Option(
    "--vllm", help="vLLM to run: a python, a vllm executable or qwenquant-vllm.json.", rich_help_panel=PANEL)]
ServeDevice = Annotated[Device | None, typer.Option(
    "--device", help="cuda or cpu (default: what the vLLM build targets).", rich_help_panel=PANEL)]
Timeout = Annotated[float, typer.Option(
    "--timeout", help="Seconds the server may take to become ready.", rich_help_panel=PANEL)]
ApiKey = Annotated[str | None, typer.Option(
    "--api-key", envvar="QWENQUANT_API_KEY", help="API key clients must send (bench and eval send it).",
    rich_help_panel=PANEL)]
Acts = Annotated[Activations | None, typer.Option(
    "--activations", help="bf16 (default) or int8: int8 sets VLLM_MARLIN_INPUT_DTYPE=int8 for vLLM (per-token int8 "
                          "activations in Marlin; on SM 9.0 Machete is disabled so Marlin runs), after checking the "
                          "artifact qualifies; beats the profile's `activations`. No effect on vLLM's CPU build.",
    rich_help_panel=PANEL, show_default=False)]
