"""The one output sink of a versioned report (bench's and eval's), in the order a user reads it: the PNG
beside the report (`png`), the JSON file written atomically (`write_report`: when that write fails after
measuring, the measurement is kept in a spare file in the temporary folder), the shown tables, where the
report went, the verdict line, and the JSON on stdout with --json (`deliver`). `json_on_failure` keeps
--json's promise when a run fails before any report: one JSON document on stdout, the error's.

A command's `Sink` holds what differs between commands: how its spare file is named, how it tells where
the report went, and whether the JSON also goes to stdout when the asked file could not be written."""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from qwenquant.errors import QwenquantError

log = logging.getLogger(__name__)
E = TypeVar("E", bound=QwenquantError)

Document = Callable[[Path | None], dict[str, Any]]  # the JSON document, as written to a path (None: stdout only)


@dataclass(frozen=True)
class Written:
    """Where a report's JSON went: `path` (the asked path, a spare file, or None: no file at all) and why
    the asked path could not be written (None: it was)."""

    path: Path | None
    failed: str | None = None


def spare_beside_pid(asked: Path) -> Path:
    """A spare named after the asked file and this process: `<tmp>/<stem>-<pid><suffix>`."""
    return Path(tempfile.gettempdir()) / f"{asked.stem}-{os.getpid()}{asked.suffix}"


def unique_spare(prefix: str) -> Callable[[Path], Path]:
    """A spare of a name no other file has: `<tmp>/<prefix>XXXXXXXX.json`."""

    def spare(asked: Path) -> Path:
        fd, name = tempfile.mkstemp(prefix=prefix, suffix=".json")
        os.close(fd)
        return Path(name)

    return spare


def write_report(asked: Path, document: Document, spare: Callable[[Path], Path]) -> Written:
    """The report's pretty JSON at `asked`, atomically; when that write fails (a full disk, a mount gone
    read-only, the folder removed while measuring), in a spare file instead, its document written for
    that path; Written(None, why) when no file could be written at all."""
    from qwenquant.atomic import atomic_write_bytes, pretty_json

    try:
        atomic_write_bytes(asked, pretty_json(document(asked)))
        return Written(asked)
    except OSError as e:
        why = e.strerror or str(e)
    try:
        where = spare(asked)
        atomic_write_bytes(where, pretty_json(document(where)))
        return Written(where, why)
    except OSError:
        return Written(None, why)


def png(path: Path, draw: Callable[[Path], None]) -> str | None:
    """The figure drawn at `path` (its path), or a warning and None: no Pillow, or the write failed."""
    try:
        draw(path)
        return str(path)
    except ImportError as e:  # Pillow comes with llm-compressor; a client-only install may lack it
        log.warning("no plot: %s (install pillow)", e)
    except OSError as e:
        log.warning("no plot: could not write %s (%s)", path, e.strerror or e)
    return None


def log_where(asked: Path, written: Written) -> None:
    """Where the report went, told as log warnings (nothing when it went where asked)."""
    if written.failed is None:
        return
    if written.path is None:
        log.warning("could not write %s (%s) nor a spare file: the report is on stdout", asked, written.failed)
        return
    log.warning("could not write %s (%s): the report goes to %s instead", asked, written.failed, written.path)


@dataclass(frozen=True)
class Sink:
    """What differs between commands: the spare's name, how the sink tells where the report went (before
    the shown lines, `tell`, and after them, `tell_after`), and whether the JSON goes to stdout as well
    when the asked file could not be written (`stdout_on_failure`; it always does when no file holds it)."""

    spare: Callable[[Path], Path] = spare_beside_pid
    tell: Callable[[Path, Written], None] = log_where
    tell_after: Callable[[Path, Written], None] | None = None
    stdout_on_failure: bool = False


def deliver(
    document: Document,
    path: Path | None,
    sink: Sink,
    *,
    as_json: bool,
    show: Callable[[], None] | None = None,
    verdict: str | None = None,
) -> Written:
    """Write the report to `path` (None: no file), tell where it went, show it (`show`, left out with
    --json) and its verdict line, and print its JSON on stdout with --json (or when no file holds it)."""
    from qwenquant.console import console, print_json

    written = write_report(path, document, sink.spare) if path is not None else Written(None)
    if path is not None:
        sink.tell(path, written)
    if show is not None and not as_json:
        show()
    if verdict is not None:
        console.print(verdict, markup=False, soft_wrap=True)
    unwritten = written.failed is not None and (sink.stdout_on_failure or written.path is None)
    if as_json or unwritten:
        print_json(document(written.path or path))
    if path is not None and sink.tell_after is not None:
        sink.tell_after(path, written)
    return written


def delivered(err: E) -> E:
    """`err`, marked as coming after its report was delivered (json_on_failure prints nothing more)."""
    err.delivered = True  # type: ignore[attr-defined]  # read back with getattr by json_on_failure
    return err


@contextlib.contextmanager
def json_on_failure(as_json: bool, head: dict[str, Any]) -> Iterator[None]:
    """With --json, a run that fails before its report is delivered (the server down, a usage error found on
    the server) still prints one JSON document on stdout: `head` (the report's mode or kind), the error, its
    hint and exit code (then raises)."""
    try:
        yield
    except QwenquantError as e:
        if as_json and not getattr(e, "delivered", False):
            from qwenquant.console import print_json

            print_json({**head, "ok": False, "error": e.message, "hint": e.hint, "exit_code": e.exit_code})
        raise
