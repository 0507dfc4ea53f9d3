"""Versioned JSON reports (`qwenquant bench`'s and `qwenquant eval`'s): reading one back from a file is
checked before anything trusts it: the file parses, its schema_version is this qwenquant's, its tag
(bench's `mode`, eval's `kind`) names a known report class, and its top-level keys are that class's
fields. A failure is one line naming the file and the field (exit 2). Writing one (`check_report_path`)
follows one rule in every command: nothing is replaced that qwenquant did not write as that kind of report."""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Collection, Mapping, Sequence
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
        return UsageError(
            f"{source}: {field_} {what}",
            hint=f"pass a JSON file `qwenquant {self.tool}` wrote (a report "
            f"of another version: re-run the {self.tool})",
        )

    def read(self, path: Path) -> Any:
        """The JSON of a report file (exit 2 when it is missing or not JSON)."""
        hint = f"pass a JSON file `qwenquant {self.tool}` wrote"
        try:
            return json.loads(Path(path).read_bytes())
        except FileNotFoundError:
            raise UsageError(f"report {path} not found", hint=hint) from None
        except (OSError, ValueError) as e:
            raise UsageError(f"report {path} is not readable JSON ({e})".splitlines()[0], hint=hint) from None

    def report_class(
        self,
        data: Any,
        source: str,
        registry: dict[str, type],
        want: str = "",
        *,
        extra: frozenset[str] = frozenset(),
        not_required: frozenset[str] = frozenset(),
    ) -> type:
        """The report class `data` is a document of (`want`: only that tag is accepted), every check passed.
        `extra`: keys allowed beside the fields; `not_required`: fields that may be absent."""
        if not isinstance(data, dict):
            raise self.refuse(source, "the top level", f"is {type(data).__name__}, not an object")
        if data.get("schema_version") != self.version:
            raise self.refuse(
                source,
                "schema_version",
                f"is {data.get('schema_version')!r}, this qwenquant reads "
                f"{self.tool} reports of schema_version {self.version}",
            )
        tag = data.get(self.tag)
        cls = registry.get(tag) if isinstance(tag, str) else None
        if cls is None or (want and cls is not registry.get(want)):
            raise self.refuse(source, self.tag, f"is {data.get(self.tag)!r}, not {want or ' | '.join(registry)}")
        names = {f.name for f in fields(cls)} | {self.tag} | extra
        unknown = sorted(set(data) - names)
        missing = sorted(
            f.name
            for f in fields(cls)
            if f.name not in data
            and f.default is MISSING
            and f.default_factory is MISSING
            and f.name not in not_required
        )
        if unknown or missing:
            field_, what = (unknown[0], "is not a field of") if unknown else (missing[0], "is missing from")
            raise self.refuse(
                source,
                field_,
                f"{what} {self.a_report} of {self.tag} {getattr(cls, self.tag)} (schema_version {self.version})",
            )
        hints = typing.get_type_hints(cls)
        for f in fields(cls):
            if f.name in data and not _is_a(data[f.name], hints.get(f.name, Any)):
                raise self.refuse(
                    source,
                    f.name,
                    f"is {_json_type(data[f.name])}, not {_type_name(hints[f.name])} "
                    f"as {self.a_report} of {self.tag} {getattr(cls, self.tag)} has it",
                )
        return cls


REPORT_SPACE = 1 << 20  # free space a report needs (a served report with every needle case is tens of KiB)


def check_report_path(
    path: Path,
    doc: DocKind,
    want: str,
    *,
    kinds: Collection[str],
    flag: str,
    identity: Mapping[str, Any] | None = None,
    explicit: bool = True,
    min_free: int = REPORT_SPACE,
    companions: Sequence[Path] = (),
) -> bool:
    """The one rule of every command that writes a report (`bench ... --out` and its PNG, `eval ... --report`),
    checked before measuring; a refusal is exit 2 naming the file and changes nothing:

    - the path is a file (or a device, written through unchecked: False), in a folder that exists, can be
      written, has `min_free` bytes free and is not inside an artifact (its manifest would stop verifying);
    - a file already there is replaced only when it is a report `doc` of kind `want` (one of `kinds`) and,
      with `identity` (dotted keys reach into sections), of the same run; anything else qwenquant did not
      write, or wrote as another kind of report, is refused;
    - each of `companions` (bench's PNG) that exists is replaced only when that old report names it.
    Returns True when the path is a regular file path (to be written atomically)."""
    path = Path(path)
    what, again = f"{flag} {path}", f"pass {flag} NEW.json, or move the file away"
    if path.exists() and not path.is_file():
        if path.is_dir():
            raise UsageError(f"{what} is a folder", hint=f"pass {flag} FILE")
        return False  # a device such as /dev/null
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"{what}: folder {parent} not found", hint=f"create it, or pass {flag} in an existing folder")
    old = _old_report(path, doc, kinds, what, again)
    _check_room(parent, what, flag, min_free)
    if old is not None:
        _check_same_run(old, doc, want, identity, what, again, explicit)
    for extra in companions:
        named = (
            old is not None
            and isinstance(old.get("png_path"), str)
            and Path(old["png_path"]).resolve() == Path(extra).resolve()
        )
        if (extra.exists() or extra.is_symlink()) and not named:
            raise UsageError(
                f"{what}: {extra} beside it is not a file qwenquant wrote for that report; not replacing it",
                hint=f"{again} (and {extra.name})",
            )
    return True


def _check_room(parent: Path, what: str, flag: str, min_free: int) -> None:
    """The report's folder: outside every artifact, writable, with `min_free` bytes free (exit 2)."""
    import shutil

    from qwenquant.atomic import writable_folder
    from qwenquant.outfolder import MANIFEST_NAME

    inside = next((p for p in (parent.resolve(), *parent.resolve().parents) if (p / MANIFEST_NAME).is_file()), None)
    if inside is not None:
        raise UsageError(
            f"{what} is inside the artifact {inside}, which would no longer verify; not writing there",
            hint=f"pass {flag} outside every artifact folder",
        )
    writable_folder(parent, what, flag)
    free = shutil.disk_usage(parent).free
    if free < min_free:
        raise UsageError(
            f"{what}: {parent} has {free:,} bytes free, the report needs up to {min_free:,}",
            hint=f"free space, or pass {flag} on another disk",
        )


def _check_same_run(
    old: dict[str, Any],
    doc: DocKind,
    want: str,
    identity: Mapping[str, Any] | None,
    what: str,
    again: str,
    explicit: bool,
) -> None:
    """The report a path holds is replaced only by a report of its kind `want` and, with `identity`, of the
    same run (exit 2; a default path, not `explicit`, is said to be keyed to the run)."""
    if old.get(doc.tag) != want:
        raise UsageError(
            f"{what} holds {doc.a_report} of {doc.tag} {old.get(doc.tag)!r}, not {want!r}; not replacing it", hint=again
        )
    differs = [k for k, v in (identity or {}).items() if _dotted(old, k) != v]
    if differs:
        raise UsageError(
            f"{what} holds a report of another run (another {', '.join(differs)}); not replacing it",
            hint=again
            + ("" if explicit else " (the default path is keyed to the artifact's root digest and the configuration)"),
        )


def _old_report(path: Path, doc: DocKind, kinds: Collection[str], what: str, again: str) -> dict[str, Any] | None:
    """The report already at `path` (None: no file), refused unless qwenquant wrote it as one of `kinds`."""
    if not (path.is_file() or path.is_symlink()):
        return None
    try:
        old = json.loads(path.read_bytes())
    except (OSError, ValueError):
        old = None
    if not isinstance(old, dict) or old.get(doc.tag) not in kinds or "schema_version" not in old:
        raise UsageError(f"{what} is not a qwenquant {doc.tool} report; not replacing it", hint=again)
    return old


def _dotted(data: Mapping[str, Any], key: str) -> Any:
    for part in key.split("."):
        data = data.get(part) if isinstance(data, Mapping) else None  # type: ignore[assignment]
    return data


_JSON_NAMES = {
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    str: "a string",
    list: "a list",
    dict: "an object",
    type(None): "null",
}


def _json_type(value: Any) -> str:
    return _JSON_NAMES.get(type(value), type(value).__name__)


def _is_a(value: Any, hint: Any) -> bool:
    """Does a JSON value have a report field's declared type (int | None, list[...], dict[...], float...)?"""
    origin = typing.get_origin(hint)
    if hint is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_is_a(value, h) for h in typing.get_args(hint))
    if hint is type(None) or hint is None:
        return value is None
    base = origin or hint
    if isinstance(base, type) and hasattr(base, "model_validate"):  # a typed part (pydantic): its keys checked by it
        return isinstance(value, dict)
    if base is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if base is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, base) if isinstance(base, type) else True


def _type_name(hint: Any) -> str:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(_type_name(h) for h in typing.get_args(hint))
    if hasattr(hint, "model_validate"):
        return "an object"
    return _JSON_NAMES.get(typing.get_origin(hint) or hint, str(hint))
