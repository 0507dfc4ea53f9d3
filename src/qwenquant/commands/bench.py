"""`qwenquant bench run|compare|depth|soak|turns` (light imports; the work is in qwenquant.bench).

Each mode is a subcommand with its own typed options (commands/_bench_options.py, the server options
of commands/_options.py); each measures one server (compare: two) and hands its typed report to
bench/output.py, which gives it to the output sink eval shares (reportsink: its JSON, PNG and verdict line). A burst is `bench depth
--concurrency N`: the same ladder, report and failure rules with N fresh prompts per rung.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from qwenquant.commands._app import app
from qwenquant.commands._bench_options import (
    AsJson,
    Label,
    MaxTokens,
    Out,
    Server,
    SideGpuMem,
    SideProfile,
    SideSplit,
    SideUrl,
    SideVllm,
    StallTimeout,
    Streams,
    Target,
    Thinking,
    ThinkingOpt,
    Workload,
    with_options,
)

if TYPE_CHECKING:
    from qwenquant.bench.launch import ConfigSpec
    from qwenquant.commands._app import Split

bench_app = typer.Typer(
    help=(
        "Measure a server: tokens/s, TTFT and MTP acceptance, each figure cross-checked against the stream's own "
        "count (a disagreement is a flag line, a failing verdict exit 8).\n\n"
        "Examples:\n\n"
        "  qwenquant bench run http://127.0.0.1:8000 --max-concurrency 8\n\n"
        "  qwenquant bench run --serve artifacts/q27b --profile single-user --gpu-mem 24GiB\n\n"
        "  qwenquant bench compare --serve artifacts/q27b --label-a mtp-on --label-b mtp-off "
        "--vllm-arg-b=--speculative-config --vllm-arg-b=null\n\n"
        "  qwenquant bench depth --serve artifacts/q27b --profile single-user --gpu-mem 24GiB\n\n"
        "  qwenquant bench depth http://127.0.0.1:8000 --concurrency 16\n\n"
        "  qwenquant bench soak http://127.0.0.1:8000 --tokens 20000 --window 1024\n\n"
        "  qwenquant bench turns http://127.0.0.1:8000 --turn-tokens 2048"
    ),
    no_args_is_help=True,
)
app.add_typer(bench_app, name="bench")
ARGS = {"allow_interspersed_args": True}


def _request(
    args: list[str] | None,
    server: Server,
    out: Path | None,
    *,
    mode: str,
    as_json: bool = False,
    configs: Any = None,
    config: Path | None = None,
) -> Any:
    """The session request of a subcommand: a URL, or --serve ARTIFACT with the server options (and vLLM flags
    after --); --out checked before anything is measured or started."""
    from qwenquant.bench.output import check_out
    from qwenquant.bench.session import Request, default_out

    url, words = _split_args(args, server.serve)
    o = server
    served = o.to_request(o.serve, words) if o.serve else None
    return Request(
        url=url,
        serve=served,
        out=check_out(out or default_out(), mode),
        configs=configs,
        config=config,
        model=o.model,
        api_key=o.api_key,
        as_json=as_json,
    )


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


def _options(w: Workload) -> Any:
    from qwenquant.bench.runner import Options

    return Options(
        prompts=w.prompts.split(","),
        samplings=w.sampling.split(","),
        thinking=w.thinking.value,
        max_tokens=w.max_tokens,
        repeats=w.repeats,
        rounds=w.rounds,
        max_concurrency=w.max_concurrency,
        ignore_eos=w.ignore_eos,
        stall_timeout=w.stall_timeout,
    )


@bench_app.command("run", context_settings=ARGS)
@with_options("workload", Workload)
@with_options("server", Server)
def run(args: Target = None, *, server: Server, workload: Workload, out: Out = None, as_json: AsJson = False) -> None:
    """The shipped workload (prompts x sampling x thinking) and a concurrency ladder on one server.

    Examples:

      qwenquant bench run http://127.0.0.1:8000 --max-concurrency 8

      qwenquant bench run --serve artifacts/q27b --profile single-user --gpu-mem 24GiB --json
    """
    from qwenquant.bench.session import argv_now
    from qwenquant.bench.session import run as measure

    req = _request(args, server, out, mode="run", as_json=as_json, config=workload.config)
    measure(req, _options(workload), argv_now())


@bench_app.command("compare", context_settings=ARGS)
@with_options("workload", Workload)
@with_options("server", Server)
def compare(
    args: Target = None,
    *,
    server: Server,
    workload: Workload,
    out: Out = None,
    as_json: AsJson = False,
    label_a: Label = "A",
    label_b: Label = "B",
    url_a: SideUrl = None,
    url_b: SideUrl = None,
    profile_a: SideProfile = None,
    profile_b: SideProfile = None,
    gpu_mem_a: SideGpuMem = None,
    gpu_mem_b: SideGpuMem = None,
    split_a: SideSplit = None,
    split_b: SideSplit = None,
    vllm_arg_a: SideVllm = None,
    vllm_arg_b: SideVllm = None,
) -> None:
    """Two configurations A and B, run in rounds A B A B ...: each figure's ratio A/B per round.

    Served (--serve): each its own server, from the --profile, --gpu-mem and vLLM flags after -- that both
    share, and its own --profile-a/-b, --gpu-mem-a/-b, --split-a/-b and --vllm-arg-a/-b; or two running servers
    (--url-a, --url-b).

    Examples:

      qwenquant bench compare --serve artifacts/q27b --profile single-user --label-a mtp-on --label-b mtp-off
      --vllm-arg-b=--speculative-config --vllm-arg-b=null

      qwenquant bench compare --url-a http://127.0.0.1:8000 --url-b http://127.0.0.1:8001
    """
    from qwenquant.bench.session import argv_now
    from qwenquant.bench.session import run as measure
    from qwenquant.errors import UsageError

    if args and not server.serve:
        raise UsageError(
            f"bench compare takes its servers as --url-a and --url-b, not {args[0]!r}",
            hint="or --serve ARTIFACT for two served configurations",
        )
    pair = (
        _side(label_a or "A", url_a, profile_a, gpu_mem_a, split_a, vllm_arg_a),
        _side(label_b or "B", url_b, profile_b, gpu_mem_b, split_b, vllm_arg_b),
    )
    req = _request(args, server, out, mode="run", as_json=as_json, configs=pair, config=workload.config)
    measure(req, _options(workload), argv_now())


def _side(
    label: str, url: str | None, profile: str | None, gpu_mem: str | None, split: Split | None, args: list[str] | None
) -> ConfigSpec:
    """One side of `bench compare`: its label, its running server or its own serve options."""
    from qwenquant.bench.launch import ConfigSpec

    return ConfigSpec(label, url, profile, gpu_mem, tuple(args or ()), split=split.value if split else None)


@bench_app.command("depth", context_settings=ARGS)
@with_options("server", Server)
def depth(
    args: Target = None,
    *,
    server: Server,
    out: Out = None,
    as_json: AsJson = False,
    thinking: ThinkingOpt = Thinking.auto,
    max_tokens: MaxTokens = None,
    stall_timeout: StallTimeout = 300.0,
    concurrency: Streams = 1,
    depths: str | None = typer.Option(
        None,
        help="Rungs in prompt tokens, e.g. 1024,4096,16384 (default: "
        "from 1024, doubling, the last exactly at the limit).",
    ),
    reuse_prefix: bool = typer.Option(
        False,
        "--reuse-prefix",
        help="Let rungs share their prompt's start (prefix-cache reuse); by default each rung's prompt is fresh.",
    ),
    config: Path | None = typer.Option(None, help="Bench config YAML: its too-good lines flag rung figures."),
) -> None:
    """Speed and health against prompt depth (--concurrency N: a burst of N fresh prompts per rung).

    A ladder of fresh prompts from 1024 tokens, doubling, up to the server's max_model_len minus the output;
    with --concurrency N each rung sends N fresh prompts of its depth at the same instant.

    Examples:

      qwenquant bench depth --serve artifacts/q27b --profile single-user --gpu-mem 24GiB

      qwenquant bench depth http://127.0.0.1:8000 --depths 1024,8192 --concurrency 16
    """
    from qwenquant.bench.longrun import run_depth_mode
    from qwenquant.bench.longtext import parse_depths
    from qwenquant.bench.rung import DepthOptions
    from qwenquant.bench.session import argv_now

    _two_tokens(max_tokens)
    if reuse_prefix and concurrency > 1:
        from qwenquant.errors import UsageError

        raise UsageError(
            "--reuse-prefix and --concurrency: a burst's prompts are fresh by design", hint="drop --reuse-prefix"
        )
    opts = DepthOptions(
        depths=parse_depths(depths) if depths else None,
        output_tokens=max_tokens or 64,
        reuse_prefix=reuse_prefix,
        stall_timeout=stall_timeout,
        thinking=thinking.single("depth"),
        concurrency=concurrency,
    )
    run_depth_mode(_request(args, server, out, mode="depth", as_json=as_json, config=config), opts, argv_now())


@bench_app.command("soak", context_settings=ARGS)
@with_options("server", Server)
def soak(
    args: Target = None,
    *,
    server: Server,
    out: Out = None,
    as_json: AsJson = False,
    thinking: ThinkingOpt = Thinking.auto,
    stall_timeout: StallTimeout = 300.0,
    concurrency: Streams = 1,
    tokens: int = typer.Option(20000, min=2, help="Tokens generated per stream."),
    window: int = typer.Option(1024, min=1, help="Generated tokens per acceptance window."),
    collapse_fraction: float = typer.Option(
        0.5, min=0.0, max=1.0, help="A window whose acceptance is below this share of the first window's has collapsed."
    ),
) -> None:
    """Long generations: MTP acceptance per window of generated tokens, and a verdict.

    The verdict fails (exit 8) on a collapse, an empty or truncated stream, an error or a restart; it is
    "not judged" when the server drafted nothing.

    Examples:

      qwenquant bench soak http://127.0.0.1:8000 --tokens 20000 --window 1024

      qwenquant bench soak --serve artifacts/q27b --profile batch --concurrency 4
    """
    from qwenquant.bench.longrun import run_soak_mode
    from qwenquant.bench.session import argv_now
    from qwenquant.bench.soakrun import SoakOptions

    opts = SoakOptions(
        tokens=tokens,
        concurrency=concurrency,
        window=window,
        fraction=collapse_fraction,
        stall_timeout=stall_timeout,
        thinking=thinking.single("soak"),
    )
    run_soak_mode(_request(args, server, out, mode="soak", as_json=as_json), opts, argv_now())


@bench_app.command("turns", context_settings=ARGS)
@with_options("server", Server)
def turns(
    args: Target = None,
    *,
    server: Server,
    out: Out = None,
    as_json: AsJson = False,
    thinking: ThinkingOpt = Thinking.auto,
    max_tokens: MaxTokens = None,
    stall_timeout: StallTimeout = 300.0,
    turn_tokens: int = typer.Option(2048, min=1, help="Tokens of shipped text per new user message."),
) -> None:
    """One conversation that grows turn by turn: TTFT, new-token prefill and prefix-cache hits per turn.

    Each turn sends the conversation so far plus a new user message of --turn-tokens, until the next would
    pass max_model_len minus the output.

    Examples:

      qwenquant bench turns http://127.0.0.1:8000 --turn-tokens 2048

      qwenquant bench turns --serve artifacts/q27b --profile long-context --gpu-mem 24GiB
    """
    from qwenquant.bench.longrun import run_turns_mode
    from qwenquant.bench.session import argv_now
    from qwenquant.bench.turns import TurnOptions

    _two_tokens(max_tokens)
    opts = TurnOptions(
        turn_tokens=turn_tokens,
        output_tokens=max_tokens or 64,
        stall_timeout=stall_timeout,
        thinking=thinking.single("turns"),
    )
    run_turns_mode(_request(args, server, out, mode="turns", as_json=as_json), opts, argv_now())


def _two_tokens(max_tokens: int | None) -> None:
    if max_tokens is not None and max_tokens < 2:
        from qwenquant.errors import UsageError

        raise UsageError(f"--max-tokens {max_tokens} leaves no decode to measure", hint="use 2 or more")
