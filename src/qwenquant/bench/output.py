"""The one writer of every `qwenquant bench` report: a typed report per mode (run, depth, soak, turns)
around its versioned JSON document, and `deliver`, which writes the JSON and the PNG beside it, shows
the tables (or the JSON with --json) and the flag and verdict lines, and returns the error of a failing
verdict (exit 8).

The output is checked before anything is measured (`check_out`: the folder exists, can be written
and has room); a write that still fails after measuring keeps the measurement: the tables are shown,
the JSON goes to the temporary folder instead, and a line says where.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from qwenquant.bench.longplot import depth_png, soak_png
from qwenquant.bench.plot import write_png
from qwenquant.bench.render import print_depth, print_report, print_soak, print_turns
from qwenquant.bench.verdicts import depth_error, soak_error, turns_error
from qwenquant.errors import BenchError, UsageError

log = logging.getLogger(__name__)
SCHEMA_VERSION = 2  # 2: cross-check flags, the streams' own counts, `mode`
MIN_FREE_BYTES = 16 << 20  # a report and its PNG are far smaller; less free than this is a full disk


def check_out(target: Path, min_free: int = MIN_FREE_BYTES) -> Path:
    """--out, checked before anything is measured: its folder exists, can be written and has room (exit 2)."""
    from qwenquant.atomic import writable_folder

    if not target.parent.is_dir():
        raise UsageError(f"--out {target}: folder {target.parent} not found", hint="create it, or pass --out elsewhere")
    writable_folder(target.parent, f"--out {target}", "--out")
    free = shutil.disk_usage(target.parent).free
    if free < min_free:
        raise UsageError(f"--out {target}: the disk holding {target.parent} has {free} bytes free",
                         hint="free some space, or pass --out on another disk")
    return target


@dataclass
class BenchReport:
    """One mode's report: its JSON document (`data`), and what draws it (`plotter`, None: no PNG), shows it
    (`shower`: tables and lines) and judges it (`judge`: the failing verdict's error, exit 8)."""

    data: dict[str, Any]
    mode: ClassVar[str] = "run"
    plotter: ClassVar[Callable[[dict[str, Any], Path], None] | None] = staticmethod(write_png)
    shower: ClassVar[Callable[[dict[str, Any]], None]] = staticmethod(print_report)
    judge: ClassVar[Callable[[dict[str, Any]], BenchError | None]] = staticmethod(lambda data: None)

    def plot(self, path: Path) -> bool:
        """Write the PNG (False: this mode has none)."""
        if self.plotter is None:
            return False
        self.plotter(self.data, path)
        return True

    def show(self) -> None:
        self.shower(self.data)

    def error(self) -> BenchError | None:
        """The failing verdict's one line (exit 8), or None."""
        return self.judge(self.data)


def _mode(mode: str, plotter: Callable[[dict[str, Any], Path], None] | None, shower: Callable[[dict[str, Any]], None],
          judge: Callable[[dict[str, Any]], BenchError | None]) -> type[BenchReport]:
    """The report type of one mode: its name, PNG, console view and verdict."""
    return type(f"{mode.title()}Report", (BenchReport,), {
        "mode": mode, "plotter": staticmethod(plotter) if plotter else None, "shower": staticmethod(shower),
        "judge": staticmethod(judge), "__doc__": f"The report of `qwenquant bench {mode}`."})


DepthReport = _mode("depth", depth_png, print_depth, depth_error)
SoakReport = _mode("soak", soak_png, print_soak, soak_error)
TurnsReport = _mode("turns", None, print_turns, turns_error)
REPORTS: dict[str, type[BenchReport]] = {r.mode: r for r in (BenchReport, DepthReport, SoakReport, TurnsReport)}


def _write_json(data: dict[str, Any], out: Path) -> Path:
    """The JSON at `out`, or (when that write fails after measuring) in the temporary folder."""
    from qwenquant.atomic import atomic_write_json

    try:
        atomic_write_json(out, data, canonical=False)
        return out
    except OSError as e:
        spare = Path(tempfile.gettempdir()) / f"{out.stem}-{os.getpid()}{out.suffix}"
        log.warning("could not write %s (%s): the report goes to %s instead", out, e.strerror or e, spare)
        data["json_path"] = str(spare)
        atomic_write_json(spare, data, canonical=False)
        return spare


def _write_png(report: BenchReport, path: Path) -> str | None:
    try:
        return str(path) if report.plot(path) else None
    except ImportError as e:  # Pillow comes with llm-compressor; a client-only install may lack it
        log.warning("no plot: %s (install pillow)", e)
    except OSError as e:
        log.warning("no plot: could not write %s (%s)", path, e.strerror or e)
    return None


def deliver(report: BenchReport, out: Path, *, as_json: bool = False, plot: bool = True) -> BenchError | None:
    """Write the JSON (and PNG), show the report, return the error of a failing verdict (exit 8)."""
    from qwenquant.console import print_json

    data = report.data
    data["schema_version"] = SCHEMA_VERSION
    data["mode"] = report.mode
    data["png_path"] = _write_png(report, out.with_suffix(".png")) if plot else None
    data["json_path"] = str(out)
    written = _write_json(data, out)
    if as_json:
        print_json(data)
    else:
        report.show()
    if written != out:
        log.warning("the report is %s (%s could not be written)", written, out)
    return report.error()
