"""Versioned JSON reports (`qwenquant bench`'s and `qwenquant eval`'s): reading one back from a file is
checked before anything trusts it: the file parses, its schema_version is this qwenquant's, its tag
(bench's `mode`, eval's `kind`) names a known report class, and its top-level keys are that class's
fields. A failure is one line naming the file and the field (exit 2)."""

from __future__ import annotations

import json
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any

from qwenquant.errors import UsageError


@dataclass(frozen=True)
class DocKind:
    """One family of reports: `bench` (tag `mode`) or `eval` (tag `kind`), at one schema_version."""

    tool: str  # bench | eval
    tag: str  # the key naming the report class
    version: int
    a_report: str  # "a bench report": how a message names one

    def refuse(self, source: str, field_: str, what: str) -> UsageError:
        return UsageError(f"{source}: {field_} {what}", hint=f"pass a JSON file `qwenquant {self.tool}` wrote (a report "
                                                             f"of another version: re-run the {self.tool})")

    def read(self, path: Path) -> Any:
        """The JSON of a report file (exit 2 when it is missing or not JSON)."""
        hint = f"pass a JSON file `qwenquant {self.tool}` wrote"
        try:
            return json.loads(Path(path).read_bytes())
        except FileNotFoundError:
            raise UsageError(f"report {path} not found", hint=hint) from None
        except (OSError, ValueError) as e:
            raise UsageError(f"report {path} is not readable JSON ({e})".splitlines()[0], hint=hint) from None

    def report_class(self, data: Any, source: str, registry: dict[str, type], want: str = "", *,
                     extra: frozenset[str] = frozenset(), not_required: frozenset[str] = frozenset()) -> type:
        """The report class `data` is a document of (`want`: only that tag is accepted), every check passed.
        `extra`: keys allowed beside the fields; `not_required`: fields that may be absent."""
        if not isinstance(data, dict):
            raise self.refuse(source, "the top level", f"is {type(data).__name__}, not an object")
        if data.get("schema_version") != self.version:
            raise self.refuse(source, "schema_version", f"is {data.get('schema_version')!r}, this qwenquant reads "
                              f"{self.tool} reports of schema_version {self.version}")
        tag = data.get(self.tag)
        cls = registry.get(tag) if isinstance(tag, str) else None
        if cls is None or (want and cls is not registry.get(want)):
            raise self.refuse(source, self.tag, f"is {data.get(self.tag)!r}, not {want or ' | '.join(registry)}")
        names = {f.name for f in fields(cls)} | {self.tag} | extra
        unknown = sorted(set(data) - names)
        missing = sorted(f.name for f in fields(cls) if f.name not in data and f.default is MISSING
                         and f.default_factory is MISSING and f.name not in not_required)
        if unknown or missing:
            field_, what = (unknown[0], "is not a field of") if unknown else (missing[0], "is missing from")
            raise self.refuse(source, field_, f"{what} {self.a_report} of {self.tag} {getattr(cls, self.tag)} "
                              f"(schema_version {self.version})")
        return cls
