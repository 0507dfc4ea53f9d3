"""The bodies of `qwenquant bench --depth`, `--soak` and `--turns`: one server (a URL, or --serve ARTIFACT with
its profile), the measurement, then JSON + PNG written before a failing verdict exits 8."""

from __future__ import annotations

import datetime
import logging
import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any

from qwenquant.bench import gpu as gpumod
from qwenquant.bench.runner import Target, resolve_model, server_version
from qwenquant.bench.session import Request, _targets, configurations
from qwenquant.bench.workload import load_config
from qwenquant.errors import BenchError, UsageError

log = logging.getLogger(__name__)
SCHEMA_VERSION = 1


def _meta(tool: str, argv: list[str]) -> dict[str, Any]:
    return {"schema_version": SCHEMA_VERSION, "tool": tool, "argv": argv, "python": platform.python_version(),
            "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "gpu_name": gpumod.gpu_name()}


def _target_info(t: Target) -> dict[str, Any]:
    return {"label": t.label, "url": t.url, "model": t.model, **t.info}


def _one_target(req: Request) -> list[Any]:
    if req.compare:
        raise UsageError("--depth, --soak and --turns measure one server", hint="drop --compare")
    return configurations(req)


def _write(report: dict[str, Any], out: Path, plot: Any) -> None:
    from qwenquant.atomic import atomic_write_json

    png = out.with_suffix(".png")
    try:
        plot(report, png)
        report["png_path"] = str(png)
    except ImportError as e:  # Pillow comes with llm-compressor; a client-only install may lack it
        log.warning("no plot: %s (install pillow)", e)
        report["png_path"] = None
    report["json_path"] = str(out)
    atomic_write_json(out, report, canonical=False)


def depth_flags(report: dict[str, Any], cfg: Any) -> list[dict[str, Any]]:
    """Rung figures beyond the bench config's too-good lines (flagged for audit, as the bench's own), every
    request's cross-checks, and a server count of a prompt that disagrees with /tokenize's."""
    from qwenquant.bench.checks import merge_checks
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
        flags.extend(merge_checks(checks))
        disagree = count_disagreement(r)
        if disagree:
            flags.append(disagree)
    return flags


def _long_session(req: Request, tool: str, argv: list[str], measure: Callable[[Any, Any], dict[str, Any]],
                  finish: Callable[[dict[str, Any]], BenchError | None]) -> dict[str, Any]:
    """One long run against one server: the shipped text, the target, `measure(target, text)`; then
    `finish(report)` writes and shows it and returns the error to raise (exit 8), raised while a
    served server is still up (its death is the run's finding, not another error)."""
    from qwenquant.bench.longtext import load_text

    text = load_text()
    meta = _meta(tool, argv)
    with _targets(req, _one_target(req)) as targets:
        t = targets[0]
        t.model = resolve_model(t)
        t.info["vllm_version"] = server_version(t) or t.info.get("vllm_version_installed")
        report = {**meta, "target": _target_info(t), **measure(t, text)}
        err = finish(report)
        if err:
            raise err
    return report


def run_depth_mode(req: Request, opts: Any, argv: list[str], show: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """The depth ladder: the report written and shown, then BenchError (exit 8) when a rung failed,
    raised while a served server is still up (its death is the ladder's finding, not another error)."""
    from qwenquant.bench.depth import run_depth
    from qwenquant.bench.longplot import depth_png

    def finish(report: dict[str, Any]) -> BenchError | None:
        report["flags"] = depth_flags(report, load_config(req.config))
        _write(report, req.out, depth_png)
        show(report)
        return depth_error(report)

    return _long_session(req, "qwenquant bench --depth", argv, lambda t, text: run_depth(t, text, opts), finish)


def depth_error(report: dict[str, Any]) -> BenchError | None:
    """The one error line of a failed ladder (exit 8), naming the depth; None when every rung worked.
    Both depths are named by one count: /tokenize's where the server has it (the server's usage count
    beside it where the two disagree), else the failing rung's is approximate and says so."""
    fail = report["failure"]
    if not fail:
        return None
    ok = [r for r in report["rungs"] if r.get("ok")]
    reason = " ".join(str(fail["reason"]).split())[:500]
    what = f"the burst ladder ({report['concurrency']} prompts at once)" if report.get("concurrency", 1) > 1 \
        else "the depth ladder"
    if report.get("tokenize"):
        at = f"{fail['depth']} tokens"
        last = "none"
        if ok:
            last = f"{ok[-1]['depth']}"
            usage = ok[-1].get("prompt_tokens")
            if any(f.get("check") == "prompt-count" and f["where"] == f"depth {ok[-1]['depth']}"
                   for f in report.get("flags") or []):
                last += f" by /tokenize; the server counted {usage}, the two counts disagree"
    else:
        at = f"about {fail['depth']} tokens (an approximate count: the server has no /tokenize)"
        last = f"{ok[-1].get('prompt_tokens')} by the server's count" if ok else "none"
    return BenchError(f"{what} failed at {at}: {reason} (last depth that worked: {last})",
                      hint=f"the report is {report['json_path']}; the server log says more")


def run_soak_mode(req: Request, opts: Any, argv: list[str], show: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """The soak: the report written and shown, then BenchError (exit 8) naming the window of a failing verdict."""
    from qwenquant.bench.longplot import soak_png
    from qwenquant.bench.soakrun import run_soak

    def finish(report: dict[str, Any]) -> BenchError | None:
        show(report)
        report["flags"] = report["verdict"]["flags"] + [f for s in report["streams"] for f in s.get("checks") or []]
        _write(report, req.out, soak_png)
        show(report)
        v = report["verdict"]
        return BenchError(f"the soak failed: {' '.join(v['line'].split())[:500]}",
                          hint=f"the report is {report['json_path']}; the server log says more") \
            if v["status"] == "failed" else None

    return _long_session(req, "qwenquant bench --soak", argv, lambda t, text: run_soak(t, text, opts), finish)


def turns_error(report: dict[str, Any]) -> BenchError | None:
    """The one error line of a failed conversation (exit 8), naming the turn and its depth."""
    fail = report["failure"]
    if not fail:
        return None
    reason = " ".join(str(fail["reason"]).split())[:500]
    last = report["last_ok_depth"]
    return BenchError(f"the conversation failed at turn {fail['turn']} ({fail['depth']} tokens of context): {reason} "
                      f"(deepest context that worked: {last if last is not None else 'none'})",
                      hint=f"the report is {report['json_path']}; the server log says more")


def run_turns_mode(req: Request, opts: Any, argv: list[str], show: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """The conversation: the report written (JSON) and shown, then BenchError (exit 8) when a turn failed."""
    from qwenquant.atomic import atomic_write_json
    from qwenquant.bench.turns import run_turns

    def finish(report: dict[str, Any]) -> BenchError | None:
        from qwenquant.bench.checks import merge_checks

        report["flags"] = merge_checks([f for r in report["turns"] for f in r.get("checks") or []])
        report["json_path"] = str(req.out)
        atomic_write_json(req.out, report, canonical=False)
        show(report)
        return turns_error(report)

    return _long_session(req, "qwenquant bench --turns", argv, lambda t, text: run_turns(t, text, opts), finish)
