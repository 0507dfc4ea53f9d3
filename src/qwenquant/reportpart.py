"""A typed part of a versioned report (bench's and eval's): pydantic, frozen, strict (an int stays an int, no
string read as a number), unknown keys refused. A part's JSON holds exactly the keys it was built or read with
(`Part.to_json`: unset fields left out, aliases as the report spells its keys), so a report read back and written
again is the same bytes. `plain` turns a report field (parts, lists and dicts of them) into its JSON;
`part_fields` names the fields of a report dataclass that hold parts (the ones its loader validates)."""

from __future__ import annotations

import typing
from dataclasses import fields
from typing import Any

from pydantic import BaseModel, ConfigDict


class Part(BaseModel):
    """One typed part of a report. Fields with a default are keys some reports lack: left out of `to_json`
    unless given. Read as JSON keys too (`part["name"]`, `part.get("name")`) where code reads a report as a dict."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, populate_by_name=True)

    def to_json(self) -> dict[str, Any]:
        """The JSON object: the keys the part was built or read with, as the report writes them."""
        return self.model_dump(mode="python", by_alias=True, exclude_unset=True)

    def given(self) -> dict[str, Any]:
        """The fields the part was built or read with, as values (parts stay parts): to build a larger part."""
        return {k: getattr(self, k) for k in self.model_fields_set}

    def __getitem__(self, key: str) -> Any:
        return self.to_json()[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.to_json().get(key, default)

    def __contains__(self, key: str) -> bool:
        return key in self.to_json()


def plain(value: Any) -> Any:
    """A report field as JSON: parts as their objects, lists and dicts of them element by element."""
    if isinstance(value, Part):
        return value.to_json()
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def holds_part(hint: Any) -> bool:
    """Whether a type hint is a part, or holds one (a list, an optional, a union)."""
    if isinstance(hint, type) and issubclass(hint, Part):
        return True
    return any(holds_part(h) for h in typing.get_args(hint))


def part_fields(cls: type) -> dict[str, Any]:
    """{field: its type} of the fields of the report dataclass `cls` whose type holds a part."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in fields(cls) if holds_part(hints[f.name])}
