"""Entry point: parse the command line, run one library call, render the result.

Errors from the library (QwenquantError) become one red line plus a hint and a non-zero exit.
Any other exception is a bug: one line too, and its traceback goes to a crash file the hint names
(`$XDG_STATE_HOME/qwenquant/crash-<time>-<pid>.txt`), so nobody has to re-run an hour-long quantize
to see it; QWENQUANT_DEBUG=1 prints it on stderr as well.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import traceback

import typer

from qwenquant import envs

# Each command module registers its commands on `app` when imported, in this order (the --help order).
from qwenquant.commands import bench, check, demo, doctor, eval, fetch, plan, publish, quantize, recipe, serve, verify  # noqa: F401
from qwenquant.commands._app import app, interrupt_line, one_line_summaries, started
from qwenquant.errors import QwenquantError

one_line_summaries(app)

# The commands whose bytes or figures come from torch's CPU arithmetic: they compute with MKL in its
# reproducible (CNR) mode (modeling/runtime.py `reproducible_mkl`).
COMPUTING = frozenset({"quantize", "eval", "demo"})


@app.callback(invoke_without_command=True)
def _root(
    ctx: typer.Context,
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bars, warnings only."),
    verbose: bool = typer.Option(
        False, "--verbose", "-v", help="Debug logging (with --version: every tool's version)."
    ),
    version: bool = typer.Option(
        False, "--version", help="Print the version and exit (with --verbose: the stack's too)."
    ),
) -> None:
    if version:
        from qwenquant.versions import version_lines

        print("\n".join(version_lines(verbose)))
        raise typer.Exit(0)
    if ctx.invoked_subcommand is None:
        print(ctx.get_help())
        raise typer.Exit(2)
    started(ctx.invoked_subcommand)
    if ctx.invoked_subcommand in COMPUTING:
        from qwenquant.modeling.runtime import reproducible_mkl

        reproducible_mkl()  # before the command's first MKL call: MKL reads its mode once
    from qwenquant.console import set_quiet, setup_logging

    set_quiet(quiet)
    setup_logging(verbose)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; return the process exit code."""
    args = sys.argv[1:] if argv is None else argv
    hit: list[int] = []

    def ctrl_c(signum: int, frame: object) -> None:
        hit.append(signum)
        raise KeyboardInterrupt

    # typer turns a KeyboardInterrupt into exit code 130 and says nothing: the handler records it.
    # SIGTERM (`kill PID`) takes the same path, so a stopped command cleans up and says the same line;
    # its exit code is the shell's for a TERM (143). Where the default handler was replaced, it stays.
    main = threading.current_thread() is threading.main_thread()
    defaults = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}
    previous = {
        s: signal.signal(s, ctrl_c) for s, default in defaults.items() if main and signal.getsignal(s) is default
    }
    done = [130]

    def finished(signum: int, frame: object) -> None:
        # the command finished (a publish committed, a report was written): a Ctrl-C while the process
        # exits (the Hub client's threads are joined) changes nothing, so the exit code stays the command's
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(done[0])

    try:
        rv = done[0] = _run(args, argv)
    finally:
        for s, handler in previous.items():  # the process itself (argv None): a late Ctrl-C keeps the exit code
            signal.signal(s, finished if argv is None and s == signal.SIGINT else handler)
    if hit and rv == 130:
        print(interrupt_line(), file=sys.stderr, flush=True)  # what was done and what was not
        return 128 + signal.SIGTERM if hit[0] == signal.SIGTERM else rv
    return rv


def _run(args: list[str], argv: list[str] | None) -> int:
    try:
        if not {"--help", "-h", "--version"} & set(args):  # help and the version need no variable
            envs.check_all()  # one set out of its range: one line naming it and the range (exit 2)
        rv = app(args=argv, standalone_mode=False, prog_name="qwenquant")
    except QwenquantError as e:
        code = _report(e, str(e), e.hint, e.exit_code)
        if getattr(e, "exit_now", False):  # threads of a client library would hold the exit (publish/hub.py)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        return code
    except (typer.Abort, KeyboardInterrupt):
        return 130
    except typer.Exit as e:
        return e.exit_code
    except typer.TyperException as e:  # usage errors (typer >= 0.29 vendors click; this is their base)
        message = getattr(e, "format_message", None)
        if message is None:
            raise
        ctx = getattr(e, "ctx", None)
        where = ctx.command_path if ctx is not None else "qwenquant"
        return _report(e, message(), f"see `{where} --help` for the options and examples", getattr(e, "exit_code", 2))
    except Exception as e:  # not one we raised on purpose: still one line, the traceback in a file
        where = f" ({e.filename})" if isinstance(e, OSError) and e.filename and str(e.filename) not in str(e) else ""
        from qwenquant.crash import write_crash_file

        crash = write_crash_file(e, ["qwenquant", *(sys.argv[1:] if argv is None else argv)])
        hint = (
            f"unexpected error; its traceback is in {crash}: attach that file when you report it"
            if crash
            else "unexpected error; no crash file could be written: re-run with QWENQUANT_DEBUG=1 for the traceback"
        )
        return _report(e, f"{type(e).__name__}: {e}{where}".splitlines()[0], hint, 1)
    return rv if isinstance(rv, int) else 0


def _debug() -> bool:
    """QWENQUANT_DEBUG=1; a value it refuses (the error being reported may be about it) counts as off."""
    try:
        return bool(envs.get("QWENQUANT_DEBUG"))
    except QwenquantError:
        return False


def _report(e: BaseException, message: str, hint: str | None, code: int) -> int:
    """error: line + hint: line on stderr (a plain traceback first with QWENQUANT_DEBUG=1)."""
    from rich.markup import escape

    from qwenquant.console import console

    if _debug():
        traceback.print_exception(e, file=sys.stderr)
        sys.stderr.flush()
    console.print(f"[bold red]error:[/] {escape(message)}", markup=True, highlight=False, soft_wrap=True)
    if hint:
        console.print(f"[yellow]hint:[/] {escape(hint)}", markup=True, highlight=False, soft_wrap=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
