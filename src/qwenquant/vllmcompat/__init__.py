"""What each vLLM release does to qwenquant's artifacts: one table by version range, CUDA and CPU builds.

Every row is read in that release's own code (the file named beside each fact in `table.py`); the hazards
(`hazards.py`) name their upstream reference and what qwenquant does about them. `row_for(version, build)`
is the one lookup: serve's launch decision, `doctor`, check and eval read it; nothing else compares vLLM
versions. A version newer than every row gets the newest row's guards and a warning; one older than every
row gets the oldest row and a warning. Pure: no vLLM import (packaging only, inside `row_for`).
"""

from __future__ import annotations

from qwenquant.vllmcompat.lookup import hazard, read_range, row_for, rows, spec_tokens_problem
from qwenquant.vllmcompat.types import BUILDS, INT8_ROUTES, CompatRow, Hazard, RowMatch

__all__ = [
    "BUILDS",
    "INT8_ROUTES",
    "CompatRow",
    "Hazard",
    "RowMatch",
    "hazard",
    "read_range",
    "row_for",
    "rows",
    "spec_tokens_problem",
]
