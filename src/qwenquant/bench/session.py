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
from typing import TYPE_CHECKING, Any

from qwenquant.bench import gpu as gpumod
from qwenquant.bench.launch import ConfigSpec, parse_config, serve_targets, url_targets
from qwenquant.bench.runner import Options, Target, run_bench, server_version
from qwenquant.bench.workload import load_config
from qwenquant.errors import UsageError

if TYPE_CHECKING:
    from qwenquant.serve.request import ServeRequest

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Request:
    """What the command line asked for: a running server's `url`, or `serve`: the artifact and the
    server options every served configuration starts from (its profile, --gpu-mem and vLLM flags
    apply where a --compare configuration says nothing)."""

    url: str | None
    serve: ServeRequest | None
    compare: tuple[str, str] | None
    options: Options
    out: Path
    config: Path | None = None
    model: str | None = None
    api_key: str | None = None
    plot: bool = True


def configurations(req: Request) -> list[ConfigSpec]:
    """One configuration, or the two of --compare (labels A and B unless named)."""
    base = req.serve
    if req.compare:
        if req.url or (base and base.extra):
            raise UsageError("--compare takes whole configurations: a URL or `-- vLLM flags` go inside each of "
                             "its two strings", hint='e.g. --compare "--profile single-user" "--profile '
                                                     'single-user -- --speculative-config null"')
        pair = [parse_config(req.compare[0], "A"), parse_config(req.compare[1], "B")]
        if base:  # --profile / --gpu-mem / --gpus / --split outside the strings apply to both where they say nothing
            pair = [dataclasses.replace(c, profile=c.profile or base.profile, gpu_mem=c.gpu_mem or base.gpu_mem,
                                        gpus=c.gpus or base.gpus, split=c.split or base.split) for c in pair]
        if pair[0].label == pair[1].label:
            raise UsageError(f"both configurations are labelled {pair[0].label!r}", hint="give them different --label")
        return pair
    if req.url and base:
        raise UsageError("give a URL or --serve ARTIFACT, not both", hint="qwenquant bench URL, or --serve ARTIFACT")
    if req.url:
        return [ConfigSpec("A", req.url, url=req.url)]
    if base is None:
        raise UsageError("nothing to measure", hint="qwenquant bench URL, or qwenquant bench --serve ARTIFACT --profile P")
    text = " ".join(filter(None, [f"--profile {base.profile}" if base.profile else "",
                                  f"--gpu-mem {base.gpu_mem}" if base.gpu_mem else "",
                                  f"--gpus {base.gpus}" if base.gpus > 1 else "",
                                  f"--split {base.split}" if base.split else "",
                                  ("-- " + " ".join(base.extra)) if base.extra else ""]))
    return [ConfigSpec("A", text, profile=base.profile, gpu_mem=base.gpu_mem, extra=base.extra, gpus=base.gpus,
                       split=base.split)]


@contextlib.contextmanager
def _targets(req: Request, configs: list[ConfigSpec]) -> Iterator[list[Target]]:
    if req.serve is None:
        yield url_targets(configs, req.api_key, req.model)
        return
    with serve_targets(req.serve, configs, log_dir=req.out.parent / (req.out.stem + "-logs")) as targets:
        yield targets


def run(req: Request, argv: list[str]) -> dict[str, Any]:
    """Measure, write the JSON (and PNG), return the report."""
    from qwenquant.atomic import atomic_write_json
    from qwenquant.bench.report import build_report

    cfg = load_config(req.config)
    configs = configurations(req)
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    with _targets(req, configs) as targets:
        for t in targets:
            t.info["vllm_version"] = server_version(t) or t.info.get("vllm_version_installed")
        with gpumod.GpuSampler() as sampler:
            runs = run_bench(targets, cfg, req.options)
    meta = {"tool": "qwenquant bench", "argv": argv, "started": started, "python": platform.python_version(),
            "gpu_name": gpumod.gpu_name(), "gpu": sampler.result,
            "options": {k: v for k, v in vars(req.options).items()}}
    report = build_report(runs, cfg, meta=meta)
    report["png_path"] = _plot(report, req.out.with_suffix(".png")) if req.plot else None
    report["json_path"] = str(req.out)
    atomic_write_json(req.out, report, canonical=False)
    return report


def _plot(report: dict[str, Any], path: Path) -> str | None:
    from qwenquant.bench.plot import write_png

    try:
        write_png(report, path)
    except ImportError as e:  # Pillow comes with llm-compressor; a client-only install may lack it
        log.warning("no plot: %s (install pillow)", e)
        return None
    return str(path)


def default_out() -> Path:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path(f"qwenquant-bench-{stamp}.json")


def argv_now() -> list[str]:
    return ["qwenquant", *sys.argv[1:]]
