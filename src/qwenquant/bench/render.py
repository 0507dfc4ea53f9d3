"""The report on the console: rich tables on stdout, where to find the JSON and PNG on stderr."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from qwenquant.bench.table import sections
from qwenquant.console import console, stdout


def print_report(report: dict[str, Any]) -> None:
    """Print every table section, then the GPU sampling verdict and the output paths."""
    # a pipe or file gets whole tables, not ones folded to 80 columns
    out = stdout if stdout.is_terminal else Console(highlight=False, width=240)
    for title, headers, rows in sections(report):
        table = Table(title=Text(title), title_justify="left")
        for h in headers:
            table.add_column(Text(h), justify="left" if h in ("config", "cell", "kind", "where", "figure") else "right",
                             no_wrap=True)
        for r in rows:
            table.add_row(*(Text(c) for c in r))  # plain text: "[min-max]" is not markup
        out.print(table)
    gpu = report.get("gpu") or {}
    if gpu.get("sampled"):
        sm = gpu.get("sm_mhz") or {}
        console.print(f"GPU {gpu.get('gpu_name')}: SM clock {sm.get('min')}-{sm.get('max')} MHz, "
                      f"throttled in {gpu['throttled_fraction']:.0%} of {gpu['samples']} samples")
    else:
        console.print(f"GPU: {gpu.get('why', 'not sampled')}")
    console.print(f"json: {report.get('json_path')}" + (f"  plot: {report['png_path']}" if report.get("png_path") else ""))
