"""The typed report of each `qwenquant bench` mode (run, depth, soak, turns): its fields are its versioned
JSON document's top-level keys, typed to the leaves (parts.py: flags, spreads, the text, the server's
health, failures, verdicts, records; runparts.py: a run's targets, cells, ladder, comparison, GPU clocks,
options and config, a long run's target); `to_json` gives the document, `from_json` and `load_report` read
one back, refusing another schema_version, an unknown mode, field or part key or a value of another type, in
one line naming the file and the field's path (exit 2). What a mode draws, shows and judges is output.py's."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, TypedDict

from qwenquant.bench.parts import (
    DepthRung,
    Failure,
    Flag,
    PrefixCache,
    QueueCounts,
    RunFailure,
    ServerHealth,
    SoakStream,
    SoakVerdict,
    TextSource,
    TurnRecord,
    WindowRecord,
)
from qwenquant.bench.runparts import Comparison, GpuClocks, RunConfig, RunOptions, RunTarget, TargetInfo
from qwenquant.reportdoc import DocKind
from qwenquant.reportpart import part_fields, plain

SCHEMA_VERSION = 2  # 2: cross-check flags, the streams' own counts, `mode`
DOC = DocKind("bench", "mode", SCHEMA_VERSION, "a bench report")


@dataclass(kw_only=True)
class BenchReport:
    """What every mode's report holds (who ran it, how, its flags, where its JSON and PNG went); each
    mode adds its measured fields."""

    tool: str
    argv: list[str]
    started: str
    python: str
    gpu_name: str | None
    flags: list[Flag] = field(default_factory=list)
    schema_version: int = SCHEMA_VERSION
    png_path: str | None = None
    json_path: str | None = None
    mode: ClassVar[str] = ""

    def to_json(self) -> dict[str, Any]:
        """The JSON document: every field, and `mode` (written with sorted keys)."""
        return {**{f.name: plain(getattr(self, f.name)) for f in fields(self)}, "mode": self.mode}

    @classmethod
    def from_json(cls, data: Any, source: str = "report") -> BenchReport:
        """The typed report of a JSON document `source` holds: its schema_version must be this qwenquant's
        and its mode one of REPORTS (the mode of `cls`, when `cls` is one mode's report); every field known,
        every part's keys and types its own."""
        kind = DOC.report_class(data, source, REPORTS, cls.mode)
        parts = part_fields(kind)
        return kind(**{k: (_part(parts[k], v, k, source) if k in parts else v) for k, v in data.items() if k != "mode"})


def _part(hint: Any, value: Any, name: str, source: str) -> Any:
    """A field's JSON as its typed part(s); a key or type the part does not have is refused (exit 2)."""
    from pydantic import TypeAdapter, ValidationError

    try:
        return TypeAdapter(hint).validate_python(value)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in (name, *first["loc"]) if not _is_type_tag(p))
        raise DOC.refuse(source, where, f"is not as a bench report has it ({first['msg']})") from None


def _is_type_tag(p: Any) -> bool:
    """A union's branch in a pydantic error location (`Flag`, `list[...]`, `none`), not a key or index."""
    return isinstance(p, str) and (p[:1].isupper() or "[" in p or p in ("none", "int", "float", "str", "bool"))


@dataclass(kw_only=True)
class RunReport(BenchReport):
    """The report of `qwenquant bench run` and `compare`: per target its cells and ladder, the A/B ratios."""

    gpu: GpuClocks | None
    options: RunOptions
    config: RunConfig
    targets: list[RunTarget]
    compare: Comparison | None
    failure: RunFailure | None = None  # the request that ended the run (exit 8); what came before is kept
    mode: ClassVar[str] = "run"


class LongHead(TypedDict):
    """The fields a long run's report starts with: who ran it, when, on what GPU, against which target."""

    tool: str
    argv: list[str]
    started: str
    python: str
    gpu_name: str | None
    target: TargetInfo


@dataclass(kw_only=True)
class LongReport(BenchReport):
    """What depth, soak and turns share: one target, the server's limit, the shipped text, server health."""

    target: TargetInfo
    max_model_len: int | None
    text: TextSource
    server: ServerHealth


@dataclass(kw_only=True)
class DepthReport(LongReport):
    """The report of `qwenquant bench depth`: one record per rung (a burst's: its requests)."""

    output_tokens: int
    depths: list[int]
    concurrency: int
    reuse_prefix: bool
    tokenize: bool | None
    nonce: str
    rungs: list[DepthRung]
    last_ok_depth: int | None
    failure: Failure | None
    draft_tokens: int = 0  # a drafting server's draft tokens: the default top rung leaves them free
    mode: ClassVar[str] = "depth"


@dataclass(kw_only=True)
class SoakReport(LongReport):
    """The report of `qwenquant bench soak`: acceptance per window, per stream, and the verdict."""

    soak_tokens: int
    concurrency: int
    window: int
    collapse_fraction: float
    source: str
    token_count_approximate: bool
    windows: list[WindowRecord]
    stream_windows: list[list[WindowRecord]] | None
    streams: list[SoakStream]
    verdict: SoakVerdict
    server_queue: QueueCounts | None = None  # the server's running/waiting gauges while the streams ran
    decoding_at_once: int | None = None  # the most streams the client saw decoding side by side
    checks: list[Flag] = field(default_factory=list)  # the streams' queue ("queued")
    mode: ClassVar[str] = "soak"


@dataclass(kw_only=True)
class TurnsReport(LongReport):
    """The report of `qwenquant bench turns`: one record per turn and the prefix cache's verdict."""

    output_tokens: int
    turn_tokens: int
    tokenize: bool | None
    nonce: str
    turns: list[TurnRecord]
    prefix_cache: PrefixCache
    last_ok_turn: int | None
    last_ok_depth: int | None
    failure: Failure | None
    mode: ClassVar[str] = "turns"


REPORTS: dict[str, type[BenchReport]] = {r.mode: r for r in (RunReport, DepthReport, SoakReport, TurnsReport)}


def load_report(path: Path) -> BenchReport:
    """The typed report in the JSON file `path` (exit 2: unreadable, another schema_version or an unknown mode)."""
    data = DOC.read(path)
    return BenchReport.from_json(data, f"report {path}")
