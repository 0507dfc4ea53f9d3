"""The one rich Console (stderr) that log lines and progress bars share."""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import time
from collections.abc import Iterator
from typing import Any

from rich.console import Console
from rich.logging import RichHandler
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from qwenquant import envs

console = Console(stderr=True, highlight=False)
stdout = Console(highlight=False, soft_wrap=True)

_quiet = False


def set_quiet(quiet: bool) -> None:
    """Turn progress bars and info chatter off (`--quiet`)."""
    global _quiet
    _quiet = quiet


def interactive() -> bool:
    """Progress bars only on a terminal, never under --quiet."""
    return not _quiet and console.is_terminal and not envs.get("QWENQUANT_NO_PROGRESS")


def setup_logging(verbose: bool = False) -> None:
    """Route library logging through the shared console so lines appear above progress bars."""
    level = logging.DEBUG if verbose else (logging.WARNING if _quiet else logging.INFO)
    root = logging.getLogger("qwenquant")
    root.handlers.clear()
    if console.is_terminal:
        handler: logging.Handler = RichHandler(console=console, show_path=False, show_time=False)
        handler.setFormatter(logging.Formatter("%(message)s"))
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    root.addHandler(handler)
    root.setLevel(level)
    root.propagate = False


def print_json(obj: Any) -> None:
    """The one way a command prints its `--json` result: indented, sorted keys, on stdout."""
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=True) + "\n")
    sys.stdout.flush()


def byte_progress(**kwargs: Any) -> Progress:
    """A progress bar for byte transfers (download, hashing); disabled off-terminal."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TextColumn("{task.fields[files]}"),
        TimeRemainingColumn(),
        console=console,
        disable=not interactive(),
        transient=False,
        **kwargs,
    )


def step_progress(**kwargs: Any) -> Progress:
    """A progress bar for counted steps (layers, stages, row chunks); disabled off-terminal."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=not interactive(),
        **kwargs,
    )


@contextlib.contextmanager
def timed(log: logging.Logger, what: str) -> Iterator[None]:
    """Log "`what` (N.N s)" at INFO when the block ends: the phases of long work without a bar."""
    start = time.monotonic()
    yield
    log.info("%s (%.1f s)", what, time.monotonic() - start)
