"""The eval report: goals, where the JSON goes (beside the artifact, outside its hashed files), the table,
the typed, versioned report per kind (`OfflineReport`, `ServedReport`: `to_json`, `from_json`,
`load_report`), its one-line verdict (written through reportsink, the output sink bench shares)."""

from __future__ import annotations

import json
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import TypeAdapter, ValidationError

from qwenquant.evaluate.reportparts import (
    Acceptance,
    Arms,
    Goal,
    Goals,
    LmHead,
    Mtp,
    Needle,
    OfflineFigures,
    ReferenceCheck,
    ServedMachine,
    SpecCheck,
    Task,
    TextSource,
    Tools,
)
from qwenquant.reportdoc import DocKind
from qwenquant.reportpart import part_fields, plain

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self is 3.11+; requires-python is 3.10

# The goals: calibrated head KL <= 0.5x round-to-nearest; W4A16 + calibrated head within 3%
# of bf16 perplexity; MTP acceptance length lowered by less than 5%.
HEAD_KL_RATIO_MAX = 0.5
PPL_DELTA_MAX_PCT = 3.0
MTP_DROP_MAX_PCT = 5.0


def goals(figures: OfflineFigures) -> Goals:
    """Each goal: its figure, its limit and whether it is met (the MTP goal only where both heads were measured)."""
    ratio, delta, change = figures.lm_head.ratio, figures.arms.artifact.delta_pct, figures.mtp.change_pct
    head = Goal(value=ratio, max=HEAD_KL_RATIO_MAX, met=ratio is not None and ratio <= HEAD_KL_RATIO_MAX)
    ppl = Goal(value=delta, max=PPL_DELTA_MAX_PCT, met=delta <= PPL_DELTA_MAX_PCT)
    if change is None:
        return Goals(head_kl_ratio=head, ppl_delta_pct=ppl)
    mtp = Goal(value=-change, max=MTP_DROP_MAX_PCT, met=-change < MTP_DROP_MAX_PCT)
    return Goals(head_kl_ratio=head, ppl_delta_pct=ppl, mtp_acceptance_drop_pct=mtp)


# the JSON's schema: version 1 adds `schema_version` and `kind` to the keys reports had before
SCHEMA_VERSION = 1
DOC = DocKind("eval", "kind", SCHEMA_VERSION, "an eval report")
TEXT_KEYS = ("text", "text_set", "repo", "revision", "file", "sha256", "license")  # where the windows came from


class PartError(ValueError):
    """A report field that is not its part's JSON: the dotted path of the first wrong key and why."""

    def __init__(self, name: str, e: ValidationError) -> None:
        err = e.errors()[0]
        self.where = ".".join([name, *(str(x) for x in err["loc"])])
        self.type, self.input = err["type"], err.get("input")
        self.msg = err["msg"][:1].lower() + err["msg"][1:]
        super().__init__(f"{self.where}: {self.msg}")


_ADAPTERS: dict[type, dict[str, TypeAdapter[Any]]] = {}


def _part_adapters(cls: type) -> dict[str, TypeAdapter[Any]]:
    """{field: its validator} of the fields of `cls` whose type holds a report part (built once per class)."""
    if cls not in _ADAPTERS:
        _ADAPTERS[cls] = {name: TypeAdapter(hint) for name, hint in part_fields(cls).items()}
    return _ADAPTERS[cls]


@dataclass(kw_only=True)
class EvalReport:
    """One eval report: its fields are the versioned JSON's top-level keys (`to_json`); `from_json` reads
    one back, refusing another schema_version, an unknown kind or a part that is not its typed JSON. Fields in
    `OPTIONAL` are left out of the JSON when None (a served run without --tools has no `tools` key). A part
    field given a JSON object (a run's result) holds it typed (reportparts)."""

    schema_version: int = SCHEMA_VERSION
    kind: ClassVar[str] = ""
    OPTIONAL: ClassVar[tuple[str, ...]] = ()

    def __setattr__(self, name: str, value: Any) -> None:
        adapter = _part_adapters(type(self)).get(name)
        try:
            if adapter is not None:
                value = adapter.validate_python(value)
        except ValidationError as e:
            raise PartError(name, e) from None
        super().__setattr__(name, value)

    def to_json(self) -> dict[str, Any]:
        """The JSON document (written with sorted keys)."""
        out = {
            f.name: plain(getattr(self, f.name))
            for f in fields(self)
            if not (f.name in self.OPTIONAL and getattr(self, f.name) is None)
        }
        return {**out, "kind": self.kind}

    @classmethod
    def of(cls, document: Mapping[str, Any]) -> Self:
        """The report of a JSON document's fields (TypeError names a key that is not a field, PartError a part
        that is not its typed JSON); a run builds its report from typed parts instead."""
        return cls(**{k: v for k, v in document.items() if k not in ("kind", "schema_version")})

    @classmethod
    def from_json(cls, data: Any, source: str = "report") -> EvalReport:
        """The typed report of a JSON document `source` holds (exit 2 on another schema_version, kind or field,
        or a part whose keys or types are not the report's)."""
        kind: type[EvalReport] = DOC.report_class(
            data,
            source,
            dict(KINDS),
            cls.kind,
            extra=frozenset(TEXT_KEYS) if data.get("kind") == "offline" else frozenset(),
            not_required=frozenset({"text_source"}),
        )
        try:
            return kind.of(data)
        except PartError as e:
            what = (
                "is missing from"
                if e.type == "missing"
                else "is not a field of"
                if e.type == "extra_forbidden"
                else f"is {json.dumps(e.input)[:40]} ({e.msg}), not what"
            )
            raise DOC.refuse(
                source, e.where, f"{what} {DOC.a_report} of kind {kind.kind} (schema_version {SCHEMA_VERSION})"
            ) from None

    def verdict(self) -> str:
        """The one line saying what the run found."""
        raise NotImplementedError


@dataclass(kw_only=True)
class OfflineReport(EvalReport):
    """`qwenquant eval offline`: the arms' figures, lm_head and MTP, what was compared on which text, the goals.
    `text_source` is where the windows came from (TEXT_KEYS), top-level keys in the JSON."""

    arms: Arms
    lm_head: LmHead
    mtp: Mtp
    windows: int
    window_len: int
    device: str
    forward: str
    seconds: float
    artifact: str
    reference: str
    reference_check: ReferenceCheck
    root_digest: str
    text_source: TextSource
    goals: Goals
    activations: str = "bf16"  # int8: the arms include artifact+int8-act (--activations int8)
    kind: ClassVar[str] = "offline"

    def to_json(self) -> dict[str, Any]:
        out = super().to_json()
        return {**{k: v for k, v in out.items() if k != "text_source"}, **self.text_source.to_json()}

    @classmethod
    def of(cls, document: Mapping[str, Any]) -> Self:
        rest = {k: v for k, v in document.items() if k not in TEXT_KEYS}
        return super().of({**rest, "text_source": {k: v for k, v in document.items() if k in TEXT_KEYS}})

    def verdict(self) -> str:
        missed = [f"{k} {g.value:.3f} (limit {g.max})" for k, g in self.goals.items() if not g.met]
        return "eval offline: " + ("every goal met" if not missed else "goal NOT met: " + "; ".join(missed))


@dataclass(kw_only=True)
class ServedReport(EvalReport):
    """`qwenquant eval served`: the gate's tasks, --tools and --needle when asked, MTP acceptance, the
    failures; `served` and `root_digest` when eval started the server (--serve ARTIFACT)."""

    url: str
    model: str
    gate: str | None
    tasks: list[Task]
    mtp: Acceptance
    min_acceptance_length: float | None
    failures: list[str]
    ok: bool
    tools: Tools | None = None  # --tools
    needle: Needle | None = None  # --needle
    served: ServedMachine | None = None  # the server eval started (--serve ARTIFACT)
    root_digest: str | None = None
    spec_check: SpecCheck | None = None  # --spec-check: greedy with MTP against without (evaluate/speccheck.py)
    kind: ClassVar[str] = "served"
    OPTIONAL: ClassVar[tuple[str, ...]] = ("tools", "needle", "served", "root_digest", "spec_check")

    def verdict(self) -> str:
        """ok or FAILED, and what ran."""
        ran = [f"gate {self.gate}: " + ", ".join(f"{t.name} {t.passed}/{t.total}" for t in self.tasks)]
        ran = ran if self.tasks else []
        tools, needle = self.tools, self.needle
        if tools is not None:
            ran.append(f"tools {sum(c.ok for c in tools.cases)}/{len(tools.cases)}")
        if needle is not None:
            ran.append(f"needle {needle.passed}/{needle.total} depths")
        mal = self.mtp.mean_acceptance_length
        ran.append(
            "MTP not measured"
            if self.mtp.unavailable
            else "MTP drafted nothing"
            if mal is None
            else f"MTP mean acceptance length {mal:.3f}"
        )
        fails = self.failures
        return f"eval served: {'ok' if not fails else f'FAILED ({len(fails)} problem(s))'}: " + "; ".join(ran)


KINDS: dict[str, type[EvalReport]] = {r.kind: r for r in (OfflineReport, ServedReport)}


def load_report(path: Path) -> EvalReport:
    """The typed report in the JSON file `path` (exit 2: unreadable, another schema_version or an unknown kind)."""
    data = DOC.read(path)
    return EvalReport.from_json(data, f"report {path}")


def parse_report(text: str | bytes, source: str) -> EvalReport:
    """The typed report `qwenquant eval ... --json` printed (`text`), checked as load_report checks a file
    (exit 2 naming `source` and the field)."""
    from qwenquant.errors import UsageError

    try:
        data = json.loads(text)
    except ValueError as e:
        raise UsageError(
            f"{source} is not JSON ({e})".splitlines()[0], hint="pass what `qwenquant eval` printed"
        ) from None
    return EvalReport.from_json(data, source)


def report_path(artifact: Path, root_digest: str, kind: str = "eval") -> Path:
    """`<artifact>.<kind>-<digest16>.json` beside the artifact folder (never inside: `verify` stays clean)."""
    artifact = Path(artifact).resolve()
    return artifact.parent / f"{artifact.name}.{kind}-{root_digest[:16]}.json"


def served_kind(activations: str | None, profile: str | None, extra_vllm_flags: Sequence[str]) -> str:
    """The served report's `kind` for report_path: `eval-served`, plus the configuration when it is not
    the default one (bf16 activations, the default profile, no flags after `--`): `eval-served-int8`,
    `eval-served-bf16.batch`, `eval-served-bf16.single-user.flags1a2b3c4d`..."""
    import hashlib

    from qwenquant.serve.request import DEFAULT_PROFILE

    acts = activations or "bf16"
    parts = [] if profile in (None, DEFAULT_PROFILE) else [profile]
    if extra_vllm_flags:
        parts.append("flags" + hashlib.sha256("\0".join(extra_vllm_flags).encode()).hexdigest()[:8])
    if acts == "bf16" and not parts:
        return "eval-served"
    return "eval-served-" + ".".join([acts, *parts])


def as_offline(document: Mapping[str, Any], source: str = "report") -> OfflineReport:
    """The typed offline report of a JSON document (`qwenquant eval offline --json`'s, or one kept in another
    JSON file), read as `from_json` reads a file (exit 2 naming `source` and the field)."""
    return typing.cast(OfflineReport, OfflineReport.from_json(document, source))


def offline_table(report: OfflineReport) -> Any:
    """A rich Table of the offline figures."""
    from qwenquant.evaluate import reporttext

    return reporttext.offline_table(report.arms, report.windows, report.window_len)


def markdown_table(report: OfflineReport) -> str:
    """The offline table as Markdown (the README's quality table)."""
    from qwenquant.evaluate import reporttext

    return reporttext.markdown_table(report.arms)


def summary_lines(report: OfflineReport) -> list[str]:
    """lm_head and MTP lines, then one line per goal."""
    from qwenquant.evaluate import reporttext

    return reporttext.summary_lines(report.arms, report.lm_head, report.mtp, report.goals)
