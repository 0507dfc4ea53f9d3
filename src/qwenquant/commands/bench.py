"""`qwenquant bench` (light imports; the work is in qwenquant.bench)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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

CONCURRENCY_HELP = ("--soak: streams at once; --depth: each rung a burst of this many fresh prompts sent at once "
                    "(both at most the profile's max-num-seqs).")
TURNS_HELP = ("One conversation that grows turn by turn (each turn the previous answer plus a new user message of "
              "--turn-tokens) until it would pass max_model_len minus the output: per turn TTFT, new-token "
              "prefill rate and prefix-cache hits.")


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
    depth: bool = typer.Option(False, "--depth", help="Speed and health against prompt depth: a ladder of fresh "
                               "prompts up to the server's max_model_len minus the output (--max-tokens, default 64)."),
    depths: str | None = typer.Option(None, help="--depth rungs in prompt tokens, e.g. 1024,4096,16384 "
                                      "(default: from 1024, doubling, the last exactly at the limit)."),
    reuse_prefix: bool = typer.Option(False, "--reuse-prefix", help="--depth: let rungs share their prompt's "
                                      "start (prefix-cache reuse); by default each rung's prompt is fresh."),
    stall_timeout: float = typer.Option(300.0, min=0.001, help="Seconds without a token from the server (keep-alive "
                                        "comments do not count) that fail a request, in every mode."),
    soak: bool = typer.Option(False, "--soak", help="Long generations: MTP acceptance per window of generated "
                              "tokens and a verdict (collapse, empty or truncated responses, errors, restarts)."),
    soak_tokens: int = typer.Option(20000, min=2, help="--soak: tokens generated per stream."),
    concurrency: int = typer.Option(1, min=1, help=CONCURRENCY_HELP),
    window: int = typer.Option(1024, min=1, help="--soak: generated tokens per acceptance window."),
    collapse_fraction: float = typer.Option(0.5, min=0.0, max=1.0, help="--soak: a window whose acceptance is "
                                            "below this share of the first window's has collapsed."),
    turns: bool = typer.Option(False, "--turns", help=TURNS_HELP),
    turn_tokens: int = typer.Option(2048, min=1, help="--turns: tokens of shipped text per new user message."),
) -> None:
    """Measure tokens/s, TTFT and MTP acceptance of a server; compare two configurations in rounds.

    Examples:

      qwenquant bench http://127.0.0.1:8000 --max-concurrency 8

      qwenquant bench --serve artifacts/q27b --profile single-user --gpu-mem 24GiB

      qwenquant bench --serve artifacts/q27b --compare "--label mtp-on --profile single-user"
      "--label mtp-off --profile single-user -- --speculative-config null"

      qwenquant bench --serve artifacts/q27b --profile single-user --gpu-mem 24GiB --depth

      qwenquant bench http://127.0.0.1:8000 --soak --soak-tokens 20000 --window 1024

      qwenquant bench http://127.0.0.1:8000 --depth --concurrency 16

      qwenquant bench http://127.0.0.1:8000 --turns --turn-tokens 2048
    """
    from qwenquant.bench.render import print_report
    from qwenquant.bench.runner import Options
    from qwenquant.bench.session import Request, argv_now, default_out, run
    from qwenquant.serve.request import ServeRequest

    url, words = _split_args(args, serve)
    served = ServeRequest.from_options(serve, profile or [], words, api_key=api_key, vllm=vllm, timeout=timeout,
                                       device=device.value if device else None, gpus=gpus,
                                       gpu_mem=gpu_mem, gpu_mem_soft=gpu_mem_soft) if serve else None
    opts = Options(prompts=prompts.split(","), samplings=sampling.split(","), thinking=thinking, max_tokens=max_tokens,
                   repeats=repeats, rounds=rounds, max_concurrency=max_concurrency, ignore_eos=ignore_eos,
                   stall_timeout=stall_timeout)
    req = Request(url=url, serve=served, compare=compare, options=opts, out=_writable_out(out or default_out()),
                  config=config, model=model, api_key=api_key)
    if depth or soak or turns:
        return _long_run(req, dict(depth=depth, soak=soak, turns=turns, turn_tokens=turn_tokens, depths=depths,
                                   max_tokens=max_tokens, thinking=thinking, reuse_prefix=reuse_prefix,
                                   stall_timeout=stall_timeout, soak_tokens=soak_tokens, concurrency=concurrency,
                                   window=window, collapse_fraction=collapse_fraction))
    print_report(run(req, argv_now()))


def _split_args(args: list[str] | None, serve: Any) -> tuple[str | None, list[str]]:
    """(the URL, the vLLM flags): a URL or --serve ARTIFACT with flags after --, not both."""
    from qwenquant.errors import UsageError

    words = list(args or [])
    if serve and words and not words[0].startswith("-"):
        raise UsageError(f"give a URL ({words[0]}) or --serve ARTIFACT, not both", hint="vLLM flags go after --")
    url = None if serve or not words else words.pop(0)
    if url is not None:
        from qwenquant.net.http import check_url

        check_url(url, "server URL")
    if words and not serve:
        raise UsageError(f"unexpected arguments {words}", hint="vLLM flags after -- go with --serve")
    return url, words


def _writable_out(target: Path) -> Path:
    """--out, checked before anything is measured: its folder exists and can be written (exit 2)."""
    from qwenquant.atomic import writable_folder
    from qwenquant.errors import UsageError

    if not target.parent.is_dir():
        raise UsageError(f"--out {target}: folder {target.parent} not found", hint="create it, or pass --out elsewhere")
    writable_folder(target.parent, f"--out {target}", "--out")
    return target


def _long_run(req: Any, o: dict[str, Any]) -> None:
    """--depth, --soak or --turns: one server, a verdict, exit 8 with one line on a failing one."""
    from qwenquant.bench.depth import DepthOptions
    from qwenquant.bench.longrun import run_depth_mode, run_soak_mode, run_turns_mode
    from qwenquant.bench.longtext import parse_depths
    from qwenquant.bench.render import print_depth, print_soak, print_turns
    from qwenquant.bench.session import argv_now
    from qwenquant.bench.soakrun import SoakOptions
    from qwenquant.errors import UsageError

    think = {"on": True, "default": None}.get(o["thinking"], False)
    if sum((o["depth"], o["soak"], o["turns"])) > 1:
        raise UsageError("--depth, --soak and --turns are separate runs", hint="run one, then the other")
    if o["soak"]:
        run_soak_mode(req, SoakOptions(tokens=o["soak_tokens"], concurrency=o["concurrency"], window=o["window"],
                                       fraction=o["collapse_fraction"], stall_timeout=o["stall_timeout"],
                                       thinking=think), argv_now(), print_soak)
        return
    if o["max_tokens"] is not None and o["max_tokens"] < 2:
        raise UsageError(f"--max-tokens {o['max_tokens']} leaves no decode to measure", hint="use 2 or more")
    if o["turns"]:
        from qwenquant.bench.turns import TurnOptions

        if o["concurrency"] > 1:
            raise UsageError(f"--concurrency {o['concurrency']} with --turns: the conversation is one user's",
                             hint="drop --concurrency (a burst is --depth --concurrency N)")

        run_turns_mode(req, TurnOptions(turn_tokens=o["turn_tokens"], output_tokens=o["max_tokens"] or 64,
                                        stall_timeout=o["stall_timeout"], thinking=think), argv_now(), print_turns)
        return
    if o["reuse_prefix"] and o["concurrency"] > 1:
        raise UsageError("--reuse-prefix and --concurrency: a burst's prompts are fresh by design",
                         hint="drop --reuse-prefix")
    dopts = DepthOptions(depths=parse_depths(o["depths"]) if o["depths"] else None,
                         output_tokens=o["max_tokens"] or 64, reuse_prefix=o["reuse_prefix"],
                         stall_timeout=o["stall_timeout"], thinking=think, concurrency=o["concurrency"])
    run_depth_mode(req, dopts, argv_now(), print_depth)
