"""Configurations under test, and servers for them started through qwenquant's own serve machinery.

A configuration is one string of options, as on the command line:
  "--profile single-user"                                  serve the artifact with this profile (the default)
  "--profile single-user --gpu-mem 24GiB -- --speculative-config null"   vLLM flags after `--`
  "--url http://host:8000"                                 an already running server
  "--label mtp-off ..."                                    the name the report uses
  "--gpus 2 --gpu-mem 24GiB"                               2 GPUs, split as serve --gpus 2 splits them
  "--gpus 2 --split pipeline"                              pipeline parallelism over 2 GPUs (serve --split)
With --serve, each configuration gets its own server (on its own free port unless `-- --port N`
is given); all of them stay up for the whole run so rounds can alternate between them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shlex
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from qwenquant.bench.runner import Target
from qwenquant.errors import BenchError, UsageError

if TYPE_CHECKING:
    from qwenquant.serve.request import ServeRequest

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ConfigSpec:
    """One configuration: a running server (`url`) or a serve profile plus extra vLLM flags."""

    label: str
    text: str
    url: str | None = None
    profile: str | None = None
    gpu_mem: str | None = None
    extra: tuple[str, ...] = ()
    gpus: int | None = None  # None: the command line's --gpus (1 unless given)
    split: str | None = None  # None: the command line's --split (from the GPUs' link unless given)


def parse_config(text: str, default_label: str) -> ConfigSpec:
    """Read one configuration string (see the module docstring)."""
    try:
        words = shlex.split(text)
    except ValueError as e:
        raise UsageError(f"cannot read the configuration {text!r}: {e}", hint="check its quoting") from None
    extra: list[str] = []
    if "--" in words:
        i = words.index("--")
        words, extra = words[:i], words[i + 1:]
    opts = {"--url": None, "--profile": None, "--gpu-mem": None, "--label": None, "--gpus": None,
            "--split": None}
    i = 0
    while i < len(words):
        name, eq, val = words[i].partition("=")
        if name not in opts:
            raise UsageError(f"unknown option {name!r} in the configuration {text!r}",
                             hint="a configuration takes --url, --profile, --gpu-mem, --gpus, --split, --label, then "
                                  "`-- vLLM flags`")
        if not eq:
            if i + 1 >= len(words):
                raise UsageError(f"{name} needs a value in the configuration {text!r}", hint=f"write {name} VALUE")
            val, i = words[i + 1], i + 1
        opts[name] = val
        i += 1
    if opts["--url"] and (opts["--profile"] or extra or opts["--gpu-mem"] or opts["--gpus"] or opts["--split"]):
        raise UsageError(f"the configuration {text!r} names a --url and serve options",
                         hint="a running server cannot be re-configured: give either --url or --profile")
    gpus = opts["--gpus"]
    if gpus is not None and (not gpus.isdigit() or int(gpus) < 1):
        raise UsageError(f"--gpus wants a GPU count in the configuration {text!r}, got {gpus!r}", hint="e.g. --gpus 2")
    if opts["--split"] not in (None, "tensor", "pipeline"):
        raise UsageError(f"unknown --split {opts['--split']!r} in the configuration {text!r}",
                         hint="use tensor or pipeline")
    return ConfigSpec(opts["--label"] or default_label, text, opts["--url"], opts["--profile"], opts["--gpu-mem"],
                      tuple(extra), int(gpus) if gpus else None, opts["--split"])


def template_reads_thinking(artifact: Path) -> bool | None:
    """Does the artifact's chat template read `enable_thinking`? None when it has no readable template."""
    jinja = artifact / "chat_template.jinja"
    try:
        if jinja.exists():
            return "enable_thinking" in jinja.read_text()
        tmpl = json.loads((artifact / "tokenizer_config.json").read_text()).get("chat_template")
    except (OSError, ValueError):
        return None
    if isinstance(tmpl, list):  # named templates
        tmpl = " ".join(str(t.get("template", "")) for t in tmpl if isinstance(t, dict))
    return "enable_thinking" in tmpl if isinstance(tmpl, str) else None


def config_request(base: ServeRequest, cfg: ConfigSpec, log_dir: Path | None) -> ServeRequest:
    """The serve request of one configuration: `base` (the command line's) with what `cfg` says."""
    return base.replace(profile=cfg.profile, gpu_mem=cfg.gpu_mem, gpu_mem_soft=base.gpu_mem_soft and bool(cfg.gpu_mem),
                        extra=cfg.extra, gpus=cfg.gpus or base.gpus, split=cfg.split or base.split, label=cfg.label,
                        log_file=log_dir / f"server-{cfg.label}.log" if log_dir else None)


def config_requests(base: ServeRequest, configs: Sequence[ConfigSpec], log_dir: Path | None) -> list[ServeRequest]:
    """One request per configuration, started in this order. All servers stay up together, so under
    a hard --gpu-mem each ballast also leaves free the limits of the servers started after it (each
    of which then starts its own); the headroom beyond their budgets is then shared, not each its own."""
    reqs = [config_request(base, cfg, log_dir) for cfg in configs]
    later = [sum(r.gpu_mem_bytes or 0 for r in reqs[i + 1:] if r.hard_limit) for i in range(len(reqs))]
    return [r.replace(ballast_reserve=n) if r.hard_limit else r for r, n in zip(reqs, later, strict=True)]


@contextlib.contextmanager
def serve_targets(base: ServeRequest, configs: Sequence[ConfigSpec], *,
                  log_dir: Path | None) -> Iterator[list[Target]]:
    """Start one server per configuration (one after another, through serve's own machinery:
    serve/launched.py), yield their Targets, stop them all."""
    from qwenquant.serve.launched import launched

    base = base.replace(artifact=Path(base.artifact).resolve())
    thinking = template_reads_thinking(base.artifact)
    with contextlib.ExitStack() as stack:
        targets = []
        for cfg, req in zip(configs, config_requests(base, configs, log_dir), strict=True):
            s = stack.enter_context(launched(req))
            targets.append(Target(cfg.label, s.url, model=s.model, api_key=base.api_key,
                                  max_num_seqs=s.prepared.profile.max_num_seqs, template_thinking=thinking,
                                  info={"config": cfg.text, **s.info}, server=s.server))
        yield targets


def url_targets(configs: Sequence[ConfigSpec], api_key: str | None, model: str | None) -> list[Target]:
    """Targets for configurations that name a running server."""
    out = []
    for cfg in configs:
        if not cfg.url:
            raise BenchError(f"the configuration {cfg.text!r} names no --url and no artifact is served",
                             hint="pass --serve ARTIFACT, or give each configuration a --url")
        url = cfg.url.rstrip("/")
        url = url[:-3] if url.endswith("/v1") else url  # the client adds /v1/... and /metrics itself
        out.append(Target(cfg.label, url, model=model, api_key=api_key, info={"config": cfg.text}))
    return out
