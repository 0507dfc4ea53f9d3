"""The server options `serve`, `bench --serve` and `eval served --serve` share, declared once
(huggingface_hub's cli/_cli_utils.py aliases are the model): the same names, defaults and help
everywhere, listed in one help panel. Each command takes them as one group (`ServerOptions`, given
to the command by `with_options`) and turns it into one ServeRequest (qwenquant.serve.request) with
`to_request`; the request is what the launch decision reads.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from qwenquant.commands._app import Activations, Device, Split
from qwenquant.serve.request import DEFAULT_TIMEOUT

if TYPE_CHECKING:
    from qwenquant.serve.request import ServeRequest

__all__ = [
    "DEFAULT_TIMEOUT",
    "PANEL",
    "Acts",
    "ApiKey",
    "GpuMem",
    "GpuMemSoft",
    "Gpus",
    "Profiles",
    "ServeArtifact",
    "ServeDevice",
    "ServeSplit",
    "ServerOptions",
    "Timeout",
    "Vllm",
    "with_options",
]

PANEL = "Server (serve; bench and eval with --serve)"

ServeArtifact = Annotated[
    Path | None,
    typer.Option(
        "--serve",
        exists=True,
        file_okay=False,
        help="Artifact to serve through `qwenquant serve`'s preflight and supervisor for the run, stopped after it.",
        rich_help_panel=PANEL,
    ),
]
Profiles = Annotated[
    list[str] | None,
    typer.Option(
        "--profile",
        "-p",
        metavar="PROFILE",
        help="Serve profile from the recipe: single-user (default), batch or long-context.",
        rich_help_panel=PANEL,
        show_default=False,
    ),
]
GpuMem = Annotated[
    str | None,
    typer.Option(
        "--gpu-mem",
        help="Behave as on a card of this size, e.g. 24GiB: sets vLLM's memory share of the real GPU "
        "(CUDA only), and a ballast process holds the rest of it (see --gpu-mem-soft).",
        rich_help_panel=PANEL,
    ),
]
GpuMemSoft = Annotated[
    bool,
    typer.Option(
        "--gpu-mem-soft",
        help="With --gpu-mem: only vLLM's budget, no hard limit (no ballast holding the rest of the GPU).",
        rich_help_panel=PANEL,
    ),
]
Gpus = Annotated[
    int,
    typer.Option(
        "--gpus",
        "--tensor-parallel-size",
        min=1,
        help="GPUs to split the model over (see --split); each must be free.",
        rich_help_panel=PANEL,
    ),
]
ServeSplit = Annotated[
    Split | None,
    typer.Option(
        "--split",
        help="With --gpus N: tensor (vLLM tensor parallelism: every layer over all GPUs) or pipeline "
        "(--pipeline-parallel-size: each GPU a run of whole layers). Default: tensor when the GPUs share "
        "NVLink or peer-to-peer PCIe (nvidia-smi topo), else pipeline; the choice and its reason are "
        "printed.",
        rich_help_panel=PANEL,
        show_default=False,
    ),
]
Vllm = Annotated[
    str | None,
    typer.Option(
        "--vllm", help="vLLM to run: a python, a vllm executable or qwenquant-vllm.json.", rich_help_panel=PANEL
    ),
]
ServeDevice = Annotated[
    Device | None,
    typer.Option("--device", help="cuda or cpu (default: what the vLLM build targets).", rich_help_panel=PANEL),
]
Timeout = Annotated[
    float, typer.Option("--timeout", help="Seconds the server may take to become ready.", rich_help_panel=PANEL)
]
ApiKey = Annotated[
    str | None,
    typer.Option(
        "--api-key",
        envvar="QWENQUANT_API_KEY",
        help="API key clients must send (bench and eval send it).",
        rich_help_panel=PANEL,
    ),
]
Acts = Annotated[
    Activations | None,
    typer.Option(
        "--activations",
        help="bf16 (default) or int8: int8 sets VLLM_MARLIN_INPUT_DTYPE=int8 for vLLM (per-token int8 "
        "activations in Marlin; on SM 9.0 Machete is disabled so Marlin runs), after checking the "
        "artifact qualifies; beats the profile's `activations`. No effect on vLLM's CPU build.",
        rich_help_panel=PANEL,
        show_default=False,
    ),
]
HostEmb = Annotated[
    bool | None,
    typer.Option(
        "--host-embeddings/--no-host-embeddings",
        help="Keep the 2.37 GiB input embedding table in pinned host memory, read by the GPU through UVA (qwenquant's "
        "vLLM plugin, installed by scripts/install-vllm.sh): about 2.4 GiB more KV cache on one CUDA GPU. Beats the "
        "profile's `host_embeddings` (long-context-max sets it).",
        rich_help_panel=PANEL,
        show_default=False,
    ),
]


@dataclass(frozen=True)
class ServerOptions:
    """The server options as one group: what `serve`, `bench --serve` and `eval served --serve` ask a server to be."""

    profile: Profiles = None
    gpu_mem: GpuMem = None
    gpu_mem_soft: GpuMemSoft = False
    activations: Acts = None
    host_embeddings: HostEmb = None
    gpus: Gpus = 1
    split: ServeSplit = None
    vllm: Vllm = None
    device: ServeDevice = None
    timeout: Timeout = DEFAULT_TIMEOUT
    api_key: ApiKey = None

    def to_request(self, artifact: Path, extra: Sequence[str] = (), **more: object) -> ServeRequest:
        """The one ServeRequest of these options for `artifact`, with the vLLM flags after -- (`extra`) and a
        command's own settings (`more`: port, dry_run, ...)."""
        from qwenquant.serve.request import ServeRequest

        return ServeRequest.from_options(
            artifact,
            self.profile or [],
            extra,
            gpu_mem=self.gpu_mem,
            gpu_mem_soft=self.gpu_mem_soft,
            activations=self.activations.value if self.activations else None,
            host_embeddings=self.host_embeddings,
            gpus=self.gpus,
            split=self.split.value if self.split else None,
            vllm=self.vllm,
            device=self.device.value if self.device else None,
            timeout=self.timeout,
            api_key=self.api_key,
            **more,
        )


def with_options(name: str, group: type) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a command the options of `group` (a dataclass of Annotated fields) as its own, declared once, and
    hand them to it as one `group` object in the parameter `name` (as shared click option decorators do)."""
    hints = typing.get_type_hints(group, include_extras=True)
    fields = dataclasses.fields(group)

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        sig = inspect.signature(func, eval_str=True)
        own = [p for p in sig.parameters.values() if p.name != name]
        added = [
            inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=hints[f.name])
            for f in fields
        ]

        @functools.wraps(func)
        def command(*args: Any, **kwargs: Any) -> Any:
            kwargs[name] = group(**{f.name: kwargs.pop(f.name) for f in fields})
            return func(*args, **kwargs)

        params = [*own, *added]
        command.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command

    return decorate
