"""`qwenquant bench` (light imports; the work is in qwenquant.bench)."""

from __future__ import annotations

from pathlib import Path

import typer

from qwenquant.commands._app import app
from qwenquant.commands._options import (
    DEFAULT_TIMEOUT,
    ApiKey,
    GpuMem,
    GpuMemSoft,
    Gpus,
    Profiles,
    ServeArtifact,
    ServeDevice,
    Timeout,
    Vllm,
)


@app.command(context_settings={"allow_interspersed_args": True})
def bench(
    args: list[str] | None = typer.Argument(None, help="URL of a running server; with --serve: vLLM flags after --.",
                                               show_default=False),
    serve: ServeArtifact = None,
    profile: Profiles = None,
    gpu_mem: GpuMem = None,
    gpu_mem_soft: GpuMemSoft = False,
    gpus: Gpus = 1,
    compare: tuple[str, str] | None = typer.Option(None, "--compare", help="Two configurations A B, run in rounds."),
    prompts: str = typer.Option("narrative,code,quote", help="Prompts to send (comma-separated)."),
    sampling: str = typer.Option("greedy,sampled", help="Sampling presets (comma-separated)."),
    thinking: str = typer.Option("auto", help="auto (off and on where supported), both, on, off, default."),
    max_tokens: int | None = typer.Option(None, min=1, help="Tokens per request (default: the bench config's)."),
    repeats: int | None = typer.Option(None, min=1, help="Requests per cell per round."),
    rounds: int | None = typer.Option(None, min=1, help="Rounds (default 1, or the config's with --compare)."),
    max_concurrency: int | None = typer.Option(None, min=1, help="Top of the ladder (default: the profile's max-num-seqs; 1 for a URL)."),
    ignore_eos: bool = typer.Option(True, help="Send ignore_eos so every request generates exactly --max-tokens."),
    model: str | None = typer.Option(None, help="Model name for a URL (default: the first it lists)."),
    api_key: ApiKey = None,
    config: Path | None = typer.Option(None, help="Bench config YAML (default: the shipped one)."),
    out: Path | None = typer.Option(None, "--out", help="JSON file to write (the PNG goes beside it)."),
    vllm: Vllm = None,
    device: ServeDevice = None,
    timeout: Timeout = DEFAULT_TIMEOUT,
) -> None:
    """Measure tokens/s, TTFT and MTP acceptance of a server; compare two configurations in rounds.

    Examples:

      qwenquant bench http://127.0.0.1:8000 --max-concurrency 8

      qwenquant bench --serve artifacts/q27b --profile single-user --gpu-mem 24GiB

      qwenquant bench --serve artifacts/q27b --compare "--label mtp-on --profile single-user"
      "--label mtp-off --profile single-user -- --speculative-config null"
    """
    from qwenquant.bench.render import print_report
    from qwenquant.bench.runner import Options
    from qwenquant.bench.session import Request, argv_now, default_out, run
    from qwenquant.errors import UsageError
    from qwenquant.serve.request import ServeRequest

    words = list(args or [])
    if serve and words and not words[0].startswith("-"):
        raise UsageError(f"give a URL ({words[0]}) or --serve ARTIFACT, not both", hint="vLLM flags go after --")
    url = None if serve or not words else words.pop(0)
    if url is not None:
        from qwenquant.net.http import check_url

        check_url(url, "server URL")
    if words and not serve:
        raise UsageError(f"unexpected arguments {words}", hint="vLLM flags after -- go with --serve")
    served = ServeRequest.from_options(serve, profile or [], words, api_key=api_key, vllm=vllm, timeout=timeout,
                                       device=device.value if device else None, gpus=gpus,
                                       gpu_mem=gpu_mem, gpu_mem_soft=gpu_mem_soft) if serve else None
    target = out or default_out()
    from qwenquant.atomic import writable_folder

    if not target.parent.is_dir():
        raise UsageError(f"--out {target}: folder {target.parent} not found", hint="create it, or pass --out elsewhere")
    writable_folder(target.parent, f"--out {target}", "--out")
    opts = Options(prompts=prompts.split(","), samplings=sampling.split(","), thinking=thinking, max_tokens=max_tokens,
                   repeats=repeats, rounds=rounds, max_concurrency=max_concurrency, ignore_eos=ignore_eos)
    print_report(run(Request(url=url, serve=served, compare=compare, options=opts, out=target,
                             config=config, model=model, api_key=api_key), argv_now()))
