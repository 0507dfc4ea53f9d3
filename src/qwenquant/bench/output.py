"""The one writer of every `qwenquant bench` report: per mode (modes.py's typed reports) what it draws (a
PNG, or none), shows (tables, flag and verdict lines) and judges (the failing verdict's error, exit 8),
each reading the typed report; and `deliver`, which hands the report to the output sink every report goes
through (reportsink: the JSON and the PNG beside it, the tables or the JSON with --json) and returns the
error of a failing verdict.

The output is checked before anything is measured (`check_out`: the folder exists, can be written
and has room, and nothing is replaced that qwenquant did not write as a report of this mode, the PNG
beside it included: the rule of every report writer, reportdoc.check_report_path); a write that still fails after measuring keeps the measurement: the tables are shown,
the JSON goes to the temporary folder instead, and a line says where.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from qwenquant import reportsink
from qwenquant.bench.longplot import depth_png, soak_png
from qwenquant.bench.modes import (
    DOC,
    REPORTS,
    SCHEMA_VERSION,
    BenchReport,
    DepthReport,
    RunReport,
    SoakReport,
    TurnsReport,
)
from qwenquant.bench.plot import write_png
from qwenquant.bench.render import print_depth, print_report, print_soak, print_turns
from qwenquant.bench.verdicts import depth_error, run_error, soak_error, turns_error
from qwenquant.errors import BenchError
from qwenquant.reportsink import Sink, Written, delivered, log_where, png, spare_beside_pid

log = logging.getLogger(__name__)
MIN_FREE_BYTES = 16 << 20  # a report and its PNG are far smaller; less free than this is a full disk
R = TypeVar("R", bound=BenchReport)


@dataclass(frozen=True)
class Output(Generic[R]):
    """What one mode's report gives a user: the PNG (`draw`, None: none), the tables and lines (`show`)
    and the failing verdict's error (`judge`, exit 8)."""

    show: Callable[[R], None]
    judge: Callable[[R], BenchError | None]
    draw: Callable[[R, Path], None] | None = None


OUTPUTS: dict[str, Output[Any]] = {
    RunReport.mode: Output[RunReport](print_report, run_error, write_png),
    DepthReport.mode: Output[DepthReport](print_depth, depth_error, depth_png),
    SoakReport.mode: Output[SoakReport](print_soak, soak_error, soak_png),
    TurnsReport.mode: Output[TurnsReport](print_turns, turns_error),
}


def check_out(target: Path, mode: str, min_free: int = MIN_FREE_BYTES) -> Path:
    """--out, checked before anything is measured by the rule of every report writer (reportdoc.check_report_path,
    exit 2): its folder exists, can be written and has room, and neither it nor the PNG beside it holds a
    file qwenquant did not write there as a bench report of this `mode`."""
    from qwenquant.reportdoc import check_report_path

    companions = [target.with_suffix(".png")] if OUTPUTS[mode].draw is not None else []
    if (
        check_report_path(target, DOC, mode, kinds=REPORTS, flag="--out", min_free=min_free, companions=companions)
        and target.is_file()
    ):
        log.info("replacing %s (a bench %s report)", target, mode)
    return target


def _after(asked: Path, written: Written) -> None:
    if written.failed is not None:
        log.warning("the report is %s (%s could not be written)", written.path or "on stdout only", asked)


SINK = Sink(spare=spare_beside_pid, tell=log_where, tell_after=_after)  # bench's: the spare named after --out


def deliver(report: BenchReport, out: Path, *, as_json: bool = False, plot: bool = True) -> BenchError | None:
    """Write the JSON (and PNG), show the report, return the error of a failing verdict (exit 8), marked as
    delivered (its report is the JSON document --json printed)."""
    output = OUTPUTS[report.mode]
    draw = output.draw

    def document(where: Path | None) -> dict[str, Any]:
        report.json_path = str(where or out)
        return report.to_json()

    report.schema_version = SCHEMA_VERSION
    report.png_path = png(out.with_suffix(".png"), lambda p: draw(report, p)) if plot and draw is not None else None
    reportsink.deliver(document, out, SINK, as_json=as_json, show=lambda: output.show(report))
    err = output.judge(report)
    return None if err is None else delivered(err)
