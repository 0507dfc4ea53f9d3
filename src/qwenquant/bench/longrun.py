"""The bodies of `qwenquant bench depth`, `soak` and `turns`: one server (a URL, or --serve ARTIFACT with
its profile), the measurement, then the report delivered (output.py: JSON + PNG, tables, flag and
verdict lines) before a failing verdict exits 8, raised while a served server is still up (its death
is the run's finding, not another error)."""

from __future__ import annotations

import datetime
import logging
import platform
from collections.abc import Callable
from typing import Any

from qwenquant.bench import gpu as gpumod
from qwenquant.bench.checks import merge_checks
from qwenquant.bench.output import BenchReport, DepthReport, SoakReport, TurnsReport, deliver
from qwenquant.bench.runner import Target, resolve_model, server_version
from qwenquant.bench.session import Request, configurations, targets_of
from qwenquant.bench.workload import load_config

log = logging.getLogger(__name__)


def _meta(tool: str, argv: list[str]) -> dict[str, Any]:
    return {"tool": tool, "argv": argv, "python": platform.python_version(),
            "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "gpu_name": gpumod.gpu_name()}


def _target_info(t: Target) -> dict[str, Any]:
    return {"label": t.label, "url": t.url, "model": t.model, **t.info}


def depth_flags(report: dict[str, Any], cfg: Any) -> list[dict[str, Any]]:
    """Rung figures beyond the bench config's too-good lines (flagged for audit, as the bench's own), every
    request's cross-checks, and a server count of a prompt that disagrees with /tokenize's."""
    from qwenquant.bench.depth import count_disagreement

    flags = []
    for r in report["rungs"]:
        for fig in ("wall_tok_s", "decode_tok_s", "prefill_tok_s", "ttft_s"):
            v = r.get(fig)
            line = cfg.ttft_floor_s if fig == "ttft_s" else getattr(cfg.too_good, fig)
            if isinstance(v, int | float) and (v < line if fig == "ttft_s" else v > line):
                flags.append({"kind": "too-good", "where": f"depth {r['depth']}", "figure": fig, "value": v,
                              "line": line, "note": "flagged for audit, not reported"})
        checks = [f for q in r.get("requests") or [r] for f in q.get("checks") or []]
        if r.get("requests"):  # a burst's own checks (its queue), beside its requests'
            checks += r.get("checks") or []
        flags.extend(merge_checks(checks))
        disagree = count_disagreement(r)
        if disagree:
            flags.append(disagree)
    return flags


def _long_session(req: Request, kind: type[BenchReport], argv: list[str],
                  measure: Callable[[Target, Any], dict[str, Any]],
                  flags: Callable[[dict[str, Any]], list[dict[str, Any]]], concurrency: int = 1) -> BenchReport:
    """One long run against one server: the shipped text, the target, `measure(target, text)`; the
    report delivered, and its failing verdict raised while a served server is still up."""
    from qwenquant.bench.longtext import load_text

    text = load_text()
    meta = _meta(f"qwenquant bench {kind.mode}", argv)
    configs = configurations(req)
    if req.serve is not None and concurrency > 1:  # refused before vLLM starts (minutes on a large model)
        from qwenquant.bench.burst import check_concurrency
        from qwenquant.bench.launch import planned_max_num_seqs

        check_concurrency(concurrency, planned_max_num_seqs(req.serve, configs[0]))
    with targets_of(req, configs) as targets:
        t = targets[0]
        t.model = resolve_model(t)
        t.info["vllm_version"] = server_version(t) or t.info.get("vllm_version_installed")
        report = kind(**meta, target=_target_info(t), **measure(t, text))
        report.flags = flags(report.to_json())
        err = deliver(report, req.out, as_json=req.as_json)
        if err:
            raise err
    return report


def run_depth_mode(req: Request, opts: Any, argv: list[str]) -> BenchReport:
    """The depth (or burst) ladder."""
    from qwenquant.bench.depth import run_depth

    cfg = load_config(req.config)
    return _long_session(req, DepthReport, argv, lambda t, text: run_depth(t, text, opts),
                         lambda data: depth_flags(data, cfg), opts.concurrency)


def run_soak_mode(req: Request, opts: Any, argv: list[str]) -> BenchReport:
    """The soak: windows, streams and the verdict naming the window of a failure."""
    from qwenquant.bench.soakrun import run_soak

    return _long_session(req, SoakReport, argv, lambda t, text: run_soak(t, text, opts),
                         lambda d: d["verdict"]["flags"] + [f for s in d["streams"] for f in s.get("checks") or []],
                         opts.concurrency)


def run_turns_mode(req: Request, opts: Any, argv: list[str]) -> BenchReport:
    """The conversation."""
    from qwenquant.bench.turns import run_turns

    return _long_session(req, TurnsReport, argv, lambda t, text: run_turns(t, text, opts),
                         lambda d: merge_checks([f for r in d["turns"] for f in r.get("checks") or []]))
