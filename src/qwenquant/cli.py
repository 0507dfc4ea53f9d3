"""Entry point: parse the command line, run one library call, render the result.

Errors from the library (QwenquantError) become one red line plus a hint and a non-zero exit;
a traceback only with QWENQUANT_DEBUG=1.
"""

from __future__ import annotations

import os
import sys

import typer

from qwenquant.commands._app import app
from qwenquant.errors import QwenquantError

# Registration: each module adds its commands to `app` on import (light imports only).
for _name in ("fetch", "quantize", "verify", "recipe", "serve", "demo", "bench"):
    try:
        __import__(f"qwenquant.commands.{_name}")
    except ModuleNotFoundError as _e:  # a command module not written yet
        if _e.name != f"qwenquant.commands.{_name}":
            raise


@app.callback()
def _root(
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bars, warnings only."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Debug logging."),
) -> None:
    from qwenquant.console import set_quiet, setup_logging

    set_quiet(quiet)
    setup_logging(verbose)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; return the process exit code."""
    try:
        rv = app(args=argv, standalone_mode=False, prog_name="qwenquant")
    except QwenquantError as e:
        from rich.markup import escape

        from qwenquant.console import console

        if os.environ.get("QWENQUANT_DEBUG") == "1":
            console.print_exception()
        console.print(f"[bold red]error:[/] {escape(str(e))}", markup=True, highlight=False, soft_wrap=True)
        if e.hint:
            console.print(f"[yellow]hint:[/] {escape(e.hint)}", markup=True, highlight=False, soft_wrap=True)
        return e.exit_code
    except (typer.Abort, KeyboardInterrupt):
        print("interrupted", file=sys.stderr)
        return 130
    except typer.Exit as e:
        return e.exit_code
    except typer.TyperException as e:  # usage errors (typer >= 0.29 vendors click; this is their base)
        show = getattr(e, "show", None)
        if show is None:
            raise
        show()
        return getattr(e, "exit_code", 2)
    return rv if isinstance(rv, int) else 0


if __name__ == "__main__":
    sys.exit(main())
