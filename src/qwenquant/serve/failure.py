"""What a starting server's log says went wrong (pure): the lines after which vLLM never becomes ready, the
first exception line that is not a wrapper's, and the hint for a fatal line."""

from __future__ import annotations

import re

# Lines after which a starting vLLM never becomes ready, although its API server may live on
# waiting for the dead engine (seen with vLLM 0.26: a tensor-parallel worker hit an illegal memory
# access and the API server waited for its engine until killed). Checked only before `ready`.
FATAL_MARKERS = (
    "WorkerProc hit an exception",
    "Engine core initialization failed",
    "CUDA error: an illegal memory access",
    "torch.OutOfMemoryError",
    "CUDA out of memory",
)


# an exception line as a traceback ends it, after vLLM's "(EngineCore pid=N) " and an optional
# "ERROR mm-dd hh:mm:ss [file:line] " record prefix; a line of another level (a WARNING that quotes
# an exception, as vLLM's ulimit warning quotes "OSError: [Errno 24] ...") is not one
_PREFIX = re.compile(r"^(?:\([\w ]+pid=\d+\)\s*)?(?:ERROR \S+ \S+ \[[^\]]*\]\s*)?")
_CAUSE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception)): (.+)")
_WRAPPERS = ("Engine core initialization failed",)


def root_cause(log_lines: list[str]) -> str | None:
    """The first exception line of the log tail that is not a wrapper's (vLLM's API server re-raises
    its engine core's failure as "Engine core initialization failed. See root cause above")."""
    for line in log_lines:
        m = _CAUSE.match(_PREFIX.sub("", line.strip(), count=1))
        if m and not any(w in m.group(2) for w in _WRAPPERS):
            return f"{m.group(1)}: {m.group(2).strip()}"[:400]
    return None


def fatal_hint(command: list[str], log_lines: list[str]) -> str:
    """What to do after a fatal line: a tensor-parallel illegal memory access has its own entry."""
    from qwenquant.serve.argv import extra_tp

    hint = "read the log above; the server is stopped"
    if (extra_tp(command) or 1) > 1 and any("illegal memory access" in line for line in log_lines):
        hint += (
            "; a tensor-parallel start that dies this way has an entry in "
            "docs/known-issues.md#tensor-parallel-illegal-memory-access with the vLLM flags to try after --"
        )
    return hint
