"""Configurations under test, and servers for them started through qwenquant's own serve machinery.

A configuration is typed, from the options of `bench run` (one) or `bench compare` (two: --label-a,
--profile-a, --gpu-mem-a, --url-a, --vllm-arg-a and the same for B): a running server (`url`), or a
serve profile with its --gpu-mem, --gpus and extra vLLM flags. With --serve, each configuration gets
its own server (on its own free port unless `-- --port N` is given); all of them stay up for the
whole run so rounds can alternate between them.
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
from qwenquant.bench.runparts import ServerInfo
from qwenquant.errors import UsageError

if TYPE_CHECKING:
    from qwenquant.serve.request import ServeRequest

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ConfigSpec:
    """One configuration: a running server (`url`) or a serve profile plus extra vLLM flags."""

    label: str
    url: str | None = None
    profile: str | None = None
    gpu_mem: str | None = None
    extra: tuple[str, ...] = ()
    gpus: int | None = None  # None: the command line's --gpus (1 unless given)
    split: str | None = None  # None: the command line's --split (from the GPUs' link unless given)

    def __post_init__(self) -> None:
        if self.url and (self.profile or self.extra or self.gpu_mem or self.gpus or self.split):
            raise UsageError(
                f"configuration {self.label} names a URL and serve options",
                hint="a running server cannot be re-configured: give it either a URL or a profile",
            )

    @property
    def text(self) -> str:
        """The configuration as the options that give it (for the report)."""
        if self.url:
            return f"--url {self.url}"
        parts = [
            f"--profile {self.profile}" if self.profile else "",
            f"--gpu-mem {self.gpu_mem}" if self.gpu_mem else "",
            f"--gpus {self.gpus}" if self.gpus and self.gpus > 1 else "",
            f"--split {self.split}" if self.split else "",
            ("-- " + shlex.join(self.extra)) if self.extra else "",
        ]
        return " ".join(p for p in parts if p)


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


def planned_max_num_seqs(base: ServeRequest, cfg: ConfigSpec) -> int | None:
    """The max-num-seqs a configuration's server will run with, from the profile serve resolves for its request
    (serve/preflight.py `request_profile`), before any server starts; None when it cannot be read here (the
    preflight then says why)."""
    from qwenquant.errors import QwenquantError
    from qwenquant.serve.preflight import request_profile

    try:
        return int(request_profile(config_request(base, cfg, None)).max_num_seqs)
    except (QwenquantError, OSError, ValueError, KeyError, TypeError):
        return None


def config_request(base: ServeRequest, cfg: ConfigSpec, log_dir: Path | None) -> ServeRequest:
    """The serve request of one configuration: `base` (the command line's) with what `cfg` says."""
    return base.replace(
        profile=cfg.profile,
        gpu_mem=cfg.gpu_mem,
        gpu_mem_soft=base.gpu_mem_soft and bool(cfg.gpu_mem),
        extra=cfg.extra,
        gpus=cfg.gpus or base.gpus,
        split=cfg.split or base.split,
        label=cfg.label,
        log_file=log_dir / f"server-{cfg.label}.log" if log_dir else None,
    )


def config_requests(base: ServeRequest, configs: Sequence[ConfigSpec], log_dir: Path | None) -> list[ServeRequest]:
    """One request per configuration, started in this order. All servers stay up together, so under
    a hard --gpu-mem each ballast also leaves free the limits of the servers started after it (each
    of which then starts its own); the headroom beyond their budgets is then shared, not each its own."""
    reqs = [config_request(base, cfg, log_dir) for cfg in configs]
    later = [sum(r.gpu_mem_bytes or 0 for r in reqs[i + 1 :] if r.hard_limit) for i in range(len(reqs))]
    return [r.replace(ballast_reserve=n) if r.hard_limit else r for r, n in zip(reqs, later, strict=True)]


@contextlib.contextmanager
def serve_targets(base: ServeRequest, configs: Sequence[ConfigSpec], *, log_dir: Path | None) -> Iterator[list[Target]]:
    """Start one server per configuration (one after another, through serve's own machinery:
    serve/launched.py), yield their Targets, stop them all."""
    from qwenquant.serve.launched import launched

    base = base.replace(artifact=Path(base.artifact).resolve())
    thinking = template_reads_thinking(base.artifact)
    with contextlib.ExitStack() as stack:
        targets = []
        for cfg, req in zip(configs, config_requests(base, configs, log_dir), strict=True):
            s = stack.enter_context(launched(req))
            targets.append(
                Target(
                    cfg.label,
                    s.url,
                    model=s.model,
                    api_key=base.api_key,
                    max_num_seqs=s.prepared.profile.max_num_seqs,
                    template_thinking=thinking,
                    info=ServerInfo.model_validate({"config": cfg.text, **s.info}),
                    server=s.server,
                )
            )
        yield targets


def url_targets(configs: Sequence[ConfigSpec], api_key: str | None, model: str | None) -> list[Target]:
    """Targets for configurations that name a running server."""
    out = []
    for cfg in configs:
        if not cfg.url:
            raise UsageError(
                f"configuration {cfg.label} names no URL and no artifact is served",
                hint="pass --serve ARTIFACT, or give each configuration a URL (--url-a, --url-b)",
            )
        url = cfg.url.rstrip("/")
        url = url[:-3] if url.endswith("/v1") else url  # the client adds /v1/... and /metrics itself
        out.append(Target(cfg.label, url, model=model, api_key=api_key, info=ServerInfo(config=cfg.text)))
    return out
