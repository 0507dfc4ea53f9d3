"""The body of `qwenquant bench`: configurations -> targets (served or given) -> measured run -> JSON + PNG."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import logging
import platform
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from qwenquant.bench import gpu as gpumod
from qwenquant.bench.launch import ConfigSpec, serve_targets, url_targets
from qwenquant.bench.modes import RunReport
from qwenquant.bench.output import deliver
from qwenquant.bench.runner import Options, Target, note_vllm_version, resolve_model, run_bench
from qwenquant.bench.runparts import RunOptions
from qwenquant.bench.workload import load_config
from qwenquant.errors import UsageError
from qwenquant.reportsink import json_on_failure

if TYPE_CHECKING:
    from qwenquant.serve.request import ServeRequest

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Request:
    """What the command line asked for: a running server's `url`, or `serve`: the artifact and the
    server options every served configuration starts from; `configs`: the two configurations of
    `bench compare` (their own profile, --gpu-mem, vLLM flags or URL, over `serve`'s where they say nothing)."""

    url: str | None
    serve: ServeRequest | None
    out: Path
    configs: tuple[ConfigSpec, ConfigSpec] | None = None
    config: Path | None = None
    model: str | None = None
    api_key: str | None = None
    as_json: bool = False
    plot: bool = True


def configurations(req: Request) -> list[ConfigSpec]:
    """One configuration, or the two of `bench compare` (labels A and B unless named)."""
    base = req.serve
    if req.configs:
        pair = list(req.configs)
        if base:  # --profile / --gpu-mem / --gpus / vLLM flags after -- apply to both where they say nothing
            pair = [
                dataclasses.replace(
                    c,
                    profile=c.profile or base.profile,
                    gpu_mem=c.gpu_mem or base.gpu_mem,
                    gpus=c.gpus or base.gpus,
                    split=c.split or base.split,
                    extra=(*base.extra, *c.extra),
                )
                for c in pair
            ]
        if pair[0].label == pair[1].label:
            raise UsageError(
                f"both configurations are labelled {pair[0].label!r}", hint="give them different --label-a / --label-b"
            )
        if pair[0].url and pair[1].url and same_server(pair[0].url, pair[1].url):
            log.warning(
                "--url-a and --url-b are one server (%s): every ratio compares it with itself; give the "
                "URL of another server for B",
                pair[0].url,
            )
        return pair
    if req.url and base:
        raise UsageError(
            "give a URL or --serve ARTIFACT, not both", hint="qwenquant bench run URL, or --serve ARTIFACT"
        )
    if req.url:
        return [ConfigSpec("A", url=req.url)]
    if base is None:
        raise UsageError(
            "nothing to measure", hint="qwenquant bench run URL, or qwenquant bench run --serve ARTIFACT --profile P"
        )
    return [
        ConfigSpec("A", profile=base.profile, gpu_mem=base.gpu_mem, extra=base.extra, gpus=base.gpus, split=base.split)
    ]


def same_server(a: str, b: str) -> bool:
    """Do two base URLs name one server (scheme, host, port and path alike; a trailing / or /v1 aside)?"""
    from urllib.parse import urlsplit

    def key(url: str) -> tuple[str, str, int | None, str]:
        u = urlsplit(url.strip())
        path = u.path.rstrip("/")
        path = path[: -len("/v1")] if path.endswith("/v1") else path
        port = u.port or {"http": 80, "https": 443}.get(u.scheme)
        host = (u.hostname or "").lower()
        return u.scheme, "127.0.0.1" if host == "localhost" else host, port, path.rstrip("/")

    return key(a) == key(b)


@contextlib.contextmanager
def targets_of(req: Request, configs: list[ConfigSpec]) -> Iterator[list[Target]]:
    """The targets of the configurations: running servers, or servers started for the with-block."""
    if req.serve is None:
        yield url_targets(configs, req.api_key, req.model)
        return
    with serve_targets(req.serve, configs, log_dir=req.out.parent / (req.out.stem + "-logs")) as targets:
        yield targets


def run(req: Request, options: Options, argv: list[str]) -> RunReport:
    """Measure, then deliver the report (JSON, PNG, tables, flag lines); with --json, one JSON document
    on stdout whatever fails."""
    with json_on_failure(req.as_json, {"mode": "run"}):
        return _run(req, options, argv)


def _run(req: Request, options: Options, argv: list[str]) -> RunReport:
    from qwenquant.bench.report import build_report

    cfg = load_config(req.config)
    configs = configurations(req)
    if req.serve is not None and options.max_concurrency:  # refused before any server starts
        from qwenquant.bench.burst import check_concurrency
        from qwenquant.bench.launch import planned_max_num_seqs

        for c in configs:
            check_concurrency(options.max_concurrency, planned_max_num_seqs(req.serve, c), "--max-concurrency")
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    with targets_of(req, configs) as targets:
        for t in targets:
            note_vllm_version(t)
            if options.max_concurrency:  # a running server that lists what it runs at once
                from qwenquant.bench.burst import check_concurrency
                from qwenquant.bench.rung import max_num_seqs

                t.model = resolve_model(t)
                check_concurrency(options.max_concurrency, max_num_seqs(t), "--max-concurrency")
        with gpumod.GpuSampler() as sampler:
            runs = run_bench(targets, cfg, options)
    report = build_report(
        runs,
        cfg,
        argv=argv,
        started=started,
        python=platform.python_version(),
        gpu_name=gpumod.gpu_name(),
        gpu=sampler.result,
        options=RunOptions(**vars(options)),
    )
    err = deliver(report, req.out, as_json=req.as_json, plot=req.plot)
    if err:
        raise err
    return report


def default_out() -> Path:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path(f"qwenquant-bench-{stamp}.json")


def argv_now() -> list[str]:
    return ["qwenquant", *sys.argv[1:]]
