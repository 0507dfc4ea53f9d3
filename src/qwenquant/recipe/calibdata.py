"""The local data file of a calibration definition, checked where it enters (before any folder is
made): every line a JSON object whose `text_field` holds text or chat messages, at least one row."""

from __future__ import annotations

import json

from qwenquant.errors import RecipeError
from qwenquant.recipe.models import CalibrationSpec

HINT = (
    "each jsonl line must be a JSON object whose `text_field` holds a string or a list of "
    '{"role", "content"} messages; `path:` resolves against the definition\'s folder'
)


def _row_problem(row: object, field: str) -> str | None:
    if not isinstance(row, dict):
        return f"is {type(row).__name__}, not a JSON object"
    if field not in row:
        return f"has no {field!r} field (fields: {', '.join(sorted(row)) or 'none'})"
    value = row[field]
    if isinstance(value, str):
        return None
    if isinstance(value, list) and all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in value):
        return None
    return f"field {field!r} is {type(value).__name__}, not text or a list of messages"


def check_calibration_data(spec: CalibrationSpec) -> None:
    """Raise RecipeError (exit 2) naming the file and line of the first problem of a local jsonl
    calibration file; hub sets are checked by their fetch, parquet by the reader."""
    if spec.source != "local":
        return
    path = spec.resolved_path()
    if path is None or not path.is_file():
        raise RecipeError(f"calibration file not found: {path}", hint=HINT)
    if path.suffix not in (".jsonl", ".json"):
        return
    rows = 0
    try:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except ValueError as e:
                    raise RecipeError(f"calibration file {path}:{n} is not valid JSON ({e})", hint=HINT) from None
                problem = _row_problem(row, spec.text_field)
                if problem:
                    raise RecipeError(f"calibration file {path}:{n} {problem}", hint=HINT)
                rows += 1
    except UnicodeDecodeError as e:
        raise RecipeError(
            f"calibration file {path} is not UTF-8 text ({e.reason} at byte {e.start})", hint=HINT
        ) from None
    except OSError as e:
        raise RecipeError(f"calibration file {path} cannot be read ({e.strerror or e})", hint=HINT) from None
    if rows == 0:
        raise RecipeError(f"calibration file {path} holds no rows", hint=HINT)
