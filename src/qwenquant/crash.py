"""The crash file: where the traceback of an unexpected error goes, so that the one line the CLI
prints is enough to report a bug without re-running the command.

`$XDG_STATE_HOME/qwenquant/crash-<UTC time>-<pid>.txt` (`~/.local/state/qwenquant/` by default),
else the temporary folder when that is not writable. Secrets are kept out: no environment, and the
value of any `--*key*` / `--*token*` option is replaced by `***`.
"""

from __future__ import annotations

import os
import platform
import sys
import tempfile
import time
import traceback
from pathlib import Path

_SECRET_WORDS = ("key", "token", "secret", "password")


def crash_dir() -> Path:
    """Where crash files go first."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "qwenquant"


def redact_argv(argv: list[str]) -> list[str]:
    """`argv` with the values of secret-looking options (`--api-key X`, `--hf-token=X`) replaced by ***."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        name, eq, _ = arg.partition("=")
        secret = arg.startswith("--") and any(w in name.lower() for w in _SECRET_WORDS)
        if hide_next:
            out.append("***")
        elif secret and eq:
            out.append(f"{name}=***")
        else:
            out.append(arg)
        hide_next = secret and not eq
    return out


def crash_text(e: BaseException, argv: list[str]) -> str:
    """What the crash file holds: the command, versions, and the full traceback (causes included)."""
    from qwenquant import __version__

    head = [
        f"qwenquant {__version__} crashed at {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}",
        f"command: {' '.join(redact_argv(argv))}",
        f"cwd: {os.getcwd()}",
        f"python {platform.python_version()} ({sys.executable}) on {platform.platform()}",
        "",
    ]
    return "\n".join(head) + "".join(traceback.format_exception(type(e), e, e.__traceback__))


def write_crash_file(e: BaseException, argv: list[str]) -> Path | None:
    """Write the crash file; return its path (None when no folder is writable)."""
    name = f"crash-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{os.getpid()}.txt"
    text = crash_text(e, argv)
    for folder in (crash_dir(), Path(tempfile.gettempdir()) / f"qwenquant-{_user()}"):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / name
            with open(path, "x", encoding="utf-8") as f:  # never overwrite: pid + second are unique enough
                f.write(text)
            return path
        except OSError:
            continue
    return None


def _user() -> str:
    try:
        return str(os.getuid())
    except AttributeError:  # not on POSIX
        return "user"
