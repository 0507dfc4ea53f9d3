"""The one writer of every `qwenquant bench` report: a typed report per mode (run, depth, soak, turns)
whose fields are its versioned JSON document's top-level keys (`to_json`; `from_json` and `load_report`
read one back, refusing another schema_version or an unknown mode), and `deliver`, which hands the report
to the output sink every report goes through (reportsink: the JSON and the PNG beside it, the tables or
the JSON with --json, the flag and verdict lines) and returns the error of a failing verdict (exit 8).

The output is checked before anything is measured (`check_out`: the folder exists, can be written
and has room, and nothing is replaced that qwenquant did not write as a report of this mode, the PNG
beside it included: the rule of every report writer, reportdoc.check_report_path); a write that still fails after measuring keeps the measurement: the tables are shown,
the JSON goes to the temporary folder instead, and a line says where.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar

from qwenquant import reportsink
from qwenquant.bench.longplot import depth_png, soak_png
from qwenquant.bench.plot import write_png
from qwenquant.bench.render import print_depth, print_report, print_soak, print_turns
from qwenquant.bench.verdicts import depth_error, run_error, soak_error, turns_error
from qwenquant.errors import BenchError
from qwenquant.reportdoc import DocKind
from qwenquant.reportsink import Sink, Written, delivered, log_where, png, spare_beside_pid

log = logging.getLogger(__name__)
SCHEMA_VERSION = 2  # 2: cross-check flags, the streams' own counts, `mode`
DOC = DocKind("bench", "mode", SCHEMA_VERSION, "a bench report")
MIN_FREE_BYTES = 16 << 20  # a report and its PNG are far smaller; less free than this is a full disk


def check_out(target: Path, mode: str, min_free: int = MIN_FREE_BYTES) -> Path:
    """--out, checked before anything is measured by the rule of every report writer (reportdoc.check_report_path,
    exit 2): its folder exists, can be written and has room, and neither it nor the PNG beside it holds a
    file qwenquant did not write there as a bench report of this `mode`."""
    from qwenquant.reportdoc import check_report_path

    png = [target.with_suffix(".png")] if REPORTS[mode].plotter is not None else []
    if (
        check_report_path(target, DOC, mode, kinds=REPORTS, flag="--out", min_free=min_free, companions=png)
        and target.is_file()
    ):
        log.info("replacing %s (a bench %s report)", target, mode)
    return target


@dataclass(kw_only=True)
class BenchReport:
    """What every mode's report holds (who ran it, how, its flags, where its JSON and PNG went); each
    mode adds its measured fields, draws (`plotter`, None: no PNG), shows (`shower`: tables and lines)
    and judges (`judge`: the failing verdict's error, exit 8) what `to_json` gives."""

    tool: str
    argv: list[str]
    started: str
    python: str
    gpu_name: str | None
    flags: list[dict[str, Any]] = field(default_factory=list)
    schema_version: int = SCHEMA_VERSION
    png_path: str | None = None
    json_path: str | None = None
    mode: ClassVar[str] = ""
    plotter: ClassVar[Callable[[dict[str, Any], Path], None] | None] = None
    shower: ClassVar[Callable[[dict[str, Any]], None]]
    judge: ClassVar[Callable[[dict[str, Any]], BenchError | None]] = staticmethod(lambda data: None)

    def to_json(self) -> dict[str, Any]:
        """The JSON document: every field, and `mode` (written with sorted keys)."""
        return {**{f.name: getattr(self, f.name) for f in fields(self)}, "mode": self.mode}

    @classmethod
    def from_json(cls, data: Any, source: str = "report") -> BenchReport:
        """The typed report of a JSON document `source` holds: its schema_version must be this qwenquant's
        and its mode one of REPORTS (the mode of `cls`, when `cls` is one mode's report); every field known."""
        kind = DOC.report_class(data, source, REPORTS, cls.mode)
        return kind(**{k: v for k, v in data.items() if k != "mode"})

    def show(self) -> None:
        self.shower(self.to_json())

    def error(self) -> BenchError | None:
        """The failing verdict's one line (exit 8), or None."""
        return self.judge(self.to_json())


@dataclass(kw_only=True)
class RunReport(BenchReport):
    """The report of `qwenquant bench run` and `compare`: per target its cells and ladder, the A/B ratios."""

    gpu: dict[str, Any] | None
    options: dict[str, Any]
    config: dict[str, Any]
    targets: list[dict[str, Any]]
    compare: dict[str, Any] | None
    failure: dict[str, Any] | None = None  # the request that ended the run (exit 8); what came before is kept
    mode: ClassVar[str] = "run"
    plotter: ClassVar[Callable[[dict[str, Any], Path], None] | None] = staticmethod(write_png)
    shower: ClassVar[Callable[[dict[str, Any]], None]] = staticmethod(print_report)
    judge: ClassVar[Callable[[dict[str, Any]], BenchError | None]] = staticmethod(run_error)


@dataclass(kw_only=True)
class _LongReport(BenchReport):
    """What depth, soak and turns share: one target, the server's limit, the shipped text, server health."""

    target: dict[str, Any]
    max_model_len: int | None
    text: dict[str, Any]
    server: dict[str, Any]


@dataclass(kw_only=True)
class DepthReport(_LongReport):
    """The report of `qwenquant bench depth`: one record per rung (a burst's: its requests)."""

    output_tokens: int
    depths: list[int]
    concurrency: int
    reuse_prefix: bool
    tokenize: bool | None
    nonce: str
    rungs: list[dict[str, Any]]
    last_ok_depth: int | None
    failure: dict[str, Any] | None
    draft_tokens: int = 0  # a drafting server's draft tokens: the default top rung leaves them free
    mode: ClassVar[str] = "depth"
    plotter: ClassVar[Callable[[dict[str, Any], Path], None] | None] = staticmethod(depth_png)
    shower: ClassVar[Callable[[dict[str, Any]], None]] = staticmethod(print_depth)
    judge: ClassVar[Callable[[dict[str, Any]], BenchError | None]] = staticmethod(depth_error)


@dataclass(kw_only=True)
class SoakReport(_LongReport):
    """The report of `qwenquant bench soak`: acceptance per window, per stream, and the verdict."""

    soak_tokens: int
    concurrency: int
    window: int
    collapse_fraction: float
    source: str
    token_count_approximate: bool
    windows: list[dict[str, Any]]
    stream_windows: list[list[dict[str, Any]]] | None
    streams: list[dict[str, Any]]
    verdict: dict[str, Any]
    server_queue: dict[str, Any] | None = None  # the server's running/waiting gauges while the streams ran
    decoding_at_once: int | None = None  # the most streams the client saw decoding side by side
    checks: list[dict[str, Any]] = field(default_factory=list)  # the streams' queue ("queued")
    mode: ClassVar[str] = "soak"
    plotter: ClassVar[Callable[[dict[str, Any], Path], None] | None] = staticmethod(soak_png)
    shower: ClassVar[Callable[[dict[str, Any]], None]] = staticmethod(print_soak)
    judge: ClassVar[Callable[[dict[str, Any]], BenchError | None]] = staticmethod(soak_error)


@dataclass(kw_only=True)
class TurnsReport(_LongReport):
    """The report of `qwenquant bench turns`: one record per turn and the prefix cache's verdict."""

    output_tokens: int
    turn_tokens: int
    tokenize: bool | None
    nonce: str
    turns: list[dict[str, Any]]
    prefix_cache: dict[str, Any]
    last_ok_turn: int | None
    last_ok_depth: int | None
    failure: dict[str, Any] | None
    mode: ClassVar[str] = "turns"
    shower: ClassVar[Callable[[dict[str, Any]], None]] = staticmethod(print_turns)
    judge: ClassVar[Callable[[dict[str, Any]], BenchError | None]] = staticmethod(turns_error)


REPORTS: dict[str, type[BenchReport]] = {r.mode: r for r in (RunReport, DepthReport, SoakReport, TurnsReport)}


def load_report(path: Path) -> BenchReport:
    """The typed report in the JSON file `path` (exit 2: unreadable, another schema_version or an unknown mode)."""
    data = DOC.read(path)
    return BenchReport.from_json(data, f"report {path}")


def _after(asked: Path, written: Written) -> None:
    if written.failed is not None:
        log.warning("the report is %s (%s could not be written)", written.path or "on stdout only", asked)


SINK = Sink(spare=spare_beside_pid, tell=log_where, tell_after=_after)  # bench's: the spare named after --out


def deliver(report: BenchReport, out: Path, *, as_json: bool = False, plot: bool = True) -> BenchError | None:
    """Write the JSON (and PNG), show the report, return the error of a failing verdict (exit 8), marked as
    delivered (its report is the JSON document --json printed)."""
    plotter = report.plotter

    def document(where: Path | None) -> dict[str, Any]:
        report.json_path = str(where or out)
        return report.to_json()

    report.schema_version = SCHEMA_VERSION
    if plot and plotter is not None:
        report.png_path = png(out.with_suffix(".png"), lambda path: plotter(report.to_json(), path))
    else:
        report.png_path = None
    reportsink.deliver(document, out, SINK, as_json=as_json, show=report.show)
    err = report.error()
    return None if err is None else delivered(err)
