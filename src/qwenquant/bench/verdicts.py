"""The one error line of a failing run (exit 8), from its report (pure): a run or compare that lost a
request names it and what was kept; the depth ladder (or the burst
ladder) names the failing depth and the last that worked by one count, the soak its verdict's line, the
conversation the failing turn."""

from __future__ import annotations

from typing import TYPE_CHECKING

from qwenquant.errors import BenchError

if TYPE_CHECKING:
    from qwenquant.bench.modes import DepthReport, RunReport, SoakReport, TurnsReport


def run_error(report: RunReport) -> BenchError | None:
    """The one error line of a run or compare that lost a request (exit 8): where, and what the report kept."""
    fail = report.failure
    if not fail:
        return None
    reason = " ".join(fail.reason.split())[:500]
    kept = sum(c.requests for t in report.targets for c in t.cells.values())
    return BenchError(
        f"{fail.failed} of {fail.of} requests of {fail.target} {fail.cell} (round "
        f"{fail.round}) failed: {reason} (the report keeps the {kept} requests measured before it)",
        hint=f"the report is {report.json_path}; the server log says more",
    )


def depth_error(report: DepthReport) -> BenchError | None:
    """The one error line of a failed ladder (exit 8), naming the depth; None when every rung worked.
    Both depths are named by one count: /tokenize's where the server has it (the server's usage count
    beside it where the two disagree), else the failing rung's is approximate and says so."""
    fail = report.failure
    if not fail:
        return None
    ok = [r for r in report.rungs if r.ok]
    reason = " ".join(fail.reason.split())[:500]
    what = f"the burst ladder ({report.concurrency} prompts at once)" if report.concurrency > 1 else "the depth ladder"
    if report.tokenize:
        at = f"{fail.depth} tokens"
        last = "none"
        if ok:
            last = f"{ok[-1].depth}"
            usage = ok[-1].prompt_tokens
            if any(f.check == "prompt-count" and f.where == f"depth {ok[-1].depth}" for f in report.flags):
                last += f" by /tokenize; the server counted {usage}, the two counts disagree"
    else:
        at = f"about {fail.depth} tokens (an approximate count: the server has no /tokenize)"
        last = f"{ok[-1].prompt_tokens} by the server's count" if ok else "none"
    return BenchError(
        f"{what} failed at {at}: {reason} (last depth that worked: {last})",
        hint=f"the report is {report.json_path}; the server log says more",
    )


def soak_error(report: SoakReport) -> BenchError | None:
    """The soak's failing verdict line; None when it passed or judged no acceptance."""
    v = report.verdict
    if v.status != "failed":
        return None
    return BenchError(
        f"the soak failed: {' '.join((v.line or '').split())[:500]}",
        hint=f"the report is {report.json_path}; the server log says more",
    )


def turns_error(report: TurnsReport) -> BenchError | None:
    """The one error line of a failed conversation (exit 8), naming the turn and its depth."""
    fail = report.failure
    if not fail:
        return None
    reason = " ".join(fail.reason.split())[:500]
    last = report.last_ok_depth
    return BenchError(
        f"the conversation failed at turn {fail.turn} ({fail.depth} tokens of context): {reason} "
        f"(deepest context that worked: {last if last is not None else 'none'})",
        hint=f"the report is {report.json_path}; the server log says more",
    )
