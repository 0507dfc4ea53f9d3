"""Target matching with compressed-tensors / vLLM semantics, shared by recipe rules and `check`."""

from __future__ import annotations

import re

from qwenquant.checkpoint.names import LM_HEAD_TARGET  # noqa: F401  (re-exported by qwenquant.recipe)


def _matches(entry: str, module: str) -> bool:
    """compressed-tensors / vLLM matching: `re:` prefix is re.match, anything else equality."""
    if entry.startswith("re:"):
        try:
            return re.match(entry[3:], module) is not None
        except re.error:
            return False
    return entry == module


def _covered(entries: list[str], module: str) -> bool:
    return any(_matches(e, module) for e in entries)


# Public names for other modules (check.py) that match config-group targets and ignore entries.
target_matches = _matches
targets_cover = _covered
