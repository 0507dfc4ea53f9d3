"""The eval report: goals, where the JSON goes (beside the artifact, outside its hashed files), the table,
the typed, versioned report per kind (`OfflineReport`, `ServedReport`: `to_json`, `from_json`,
`load_report`), its one-line verdict (written through reportsink, the output sink bench shares)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from qwenquant.reportdoc import DocKind

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self is 3.11+; requires-python is 3.10

# The goals: calibrated head KL <= 0.5x round-to-nearest; W4A16 + calibrated head within 3%
# of bf16 perplexity; MTP acceptance length lowered by less than 5%.
HEAD_KL_RATIO_MAX = 0.5
PPL_DELTA_MAX_PCT = 3.0
MTP_DROP_MAX_PCT = 5.0


def goals(report: dict[str, Any]) -> dict[str, Any]:
    """Each goal: its figure, its limit and whether it is met."""
    out: dict[str, Any] = {}
    ratio = report["lm_head"].get("ratio")
    out["head_kl_ratio"] = {
        "value": ratio,
        "max": HEAD_KL_RATIO_MAX,
        "met": ratio is not None and ratio <= HEAD_KL_RATIO_MAX,
    }
    delta = report["arms"]["artifact"]["delta_pct"]
    out["ppl_delta_pct"] = {"value": delta, "max": PPL_DELTA_MAX_PCT, "met": delta <= PPL_DELTA_MAX_PCT}
    change = report["mtp"].get("change_pct")
    if change is not None:
        out["mtp_acceptance_drop_pct"] = {"value": -change, "max": MTP_DROP_MAX_PCT, "met": -change < MTP_DROP_MAX_PCT}
    return out


# the JSON's schema: version 1 adds `schema_version` and `kind` to the keys reports had before
SCHEMA_VERSION = 1
DOC = DocKind("eval", "kind", SCHEMA_VERSION, "an eval report")
TEXT_KEYS = ("text", "text_set", "repo", "revision", "file", "sha256", "license")  # where the windows came from


@dataclass(kw_only=True)
class EvalReport:
    """One eval report: its fields are the versioned JSON's top-level keys (`to_json`); `from_json` reads
    one back, refusing another schema_version or an unknown kind. Fields in `OPTIONAL` are left out of
    the JSON when None (a served run without --tools has no `tools` key)."""

    schema_version: int = SCHEMA_VERSION
    kind: ClassVar[str] = ""
    OPTIONAL: ClassVar[tuple[str, ...]] = ()

    def to_json(self) -> dict[str, Any]:
        """The JSON document (written with sorted keys)."""
        out = {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if not (f.name in self.OPTIONAL and getattr(self, f.name) is None)
        }
        return {**out, "kind": self.kind}

    @classmethod
    def of(cls, result: dict[str, Any]) -> Self:
        """The report of a run's measured `result` (its keys are the fields; TypeError names one that is not)."""
        return cls(**{k: v for k, v in result.items() if k not in ("kind", "schema_version")})

    @classmethod
    def from_json(cls, data: Any, source: str = "report") -> EvalReport:
        """The typed report of a JSON document `source` holds (exit 2 on another schema_version, kind or field)."""
        kind = DOC.report_class(
            data,
            source,
            KINDS,
            cls.kind,
            extra=frozenset(TEXT_KEYS) if data.get("kind") == "offline" else frozenset(),
            not_required=frozenset({"text_source"}),
        )
        return kind.of(data)

    def verdict(self) -> str:
        """The one line saying what the run found."""
        return verdict_line(self.to_json())


@dataclass(kw_only=True)
class OfflineReport(EvalReport):
    """`qwenquant eval offline`: the arms' figures, lm_head and MTP, what was compared on which text, the goals.
    `text_source` is where the windows came from (TEXT_KEYS), top-level keys in the JSON."""

    arms: dict[str, Any]
    lm_head: dict[str, Any]
    mtp: dict[str, Any]
    windows: int
    window_len: int
    device: str
    forward: str
    seconds: float
    artifact: str
    reference: str
    reference_check: dict[str, Any]
    root_digest: str
    text_source: dict[str, Any]
    goals: dict[str, Any]
    activations: str = "bf16"  # int8: the arms include artifact+int8-act (--activations int8)
    kind: ClassVar[str] = "offline"

    def to_json(self) -> dict[str, Any]:
        out = super().to_json()
        return {**{k: v for k, v in out.items() if k != "text_source"}, **self.text_source}

    @classmethod
    def of(cls, result: dict[str, Any]) -> Self:
        rest = {k: v for k, v in result.items() if k not in TEXT_KEYS}
        return super().of({**rest, "text_source": {k: v for k, v in result.items() if k in TEXT_KEYS}})


@dataclass(kw_only=True)
class ServedReport(EvalReport):
    """`qwenquant eval served`: the gate's tasks, --tools and --needle when asked, MTP acceptance, the
    failures; `served` and `root_digest` when eval started the server (--serve ARTIFACT)."""

    url: str
    model: str
    gate: str | None
    tasks: list[dict[str, Any]]
    mtp: dict[str, Any]
    min_acceptance_length: float | None
    failures: list[str]
    ok: bool
    tools: dict[str, Any] | None = None
    needle: dict[str, Any] | None = None
    served: dict[str, Any] | None = None
    root_digest: str | None = None
    spec_check: dict[str, Any] | None = None  # --spec-check: greedy with MTP against without (evaluate/speccheck.py)
    kind: ClassVar[str] = "served"
    OPTIONAL: ClassVar[tuple[str, ...]] = ("tools", "needle", "served", "root_digest", "spec_check")


KINDS: dict[str, type[EvalReport]] = {r.kind: r for r in (OfflineReport, ServedReport)}


def load_report(path: Path) -> EvalReport:
    """The typed report in the JSON file `path` (exit 2: unreadable, another schema_version or an unknown kind)."""
    data = DOC.read(path)
    return EvalReport.from_json(data, f"report {path}")


def verdict_line(result: dict[str, Any]) -> str:
    """One line saying what the run found: goals met or not (offline), ok or FAILED and what ran (served)."""
    if result.get("kind") == "offline":
        missed = [
            f"{k} {g['value']:.3f} (limit {g['max']})" for k, g in result.get("goals", {}).items() if not g["met"]
        ]
        return "eval offline: " + ("every goal met" if not missed else "goal NOT met: " + "; ".join(missed))
    ran = (
        [f"gate {result.get('gate')}: " + ", ".join(f"{t['name']} {t['passed']}/{t['total']}" for t in result["tasks"])]
        if result.get("tasks")
        else []
    )
    if "tools" in result:
        c = result["tools"]["cases"]
        ran.append(f"tools {sum(x['ok'] for x in c)}/{len(c)}")
    if "needle" in result:
        ran.append(f"needle {result['needle']['passed']}/{result['needle']['total']} depths")
    m = result["mtp"]
    mal = m.get("mean_acceptance_length")
    ran.append(
        "MTP not measured"
        if m.get("unavailable")
        else "MTP drafted nothing"
        if mal is None
        else f"MTP mean acceptance length {mal:.3f}"
    )
    fails = result.get("failures") or []
    return f"eval served: {'ok' if not fails else f'FAILED ({len(fails)} problem(s))'}: " + "; ".join(ran)


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


def _pct(x: float) -> str:
    return f"{x:+.2f}%"


TABLE_COLUMNS = (
    "arm",
    "perplexity",
    "delta vs bf16",
    "95% CI (t)",
    "worse windows",
    "KL (nats)",
    "KL p99",
    "KL p99.9",
    "top-1",
)


def table_rows(report: dict[str, Any]) -> list[list[str]]:
    """The offline table's cells, as printed (the terminal table and the README's are these)."""
    arms = report["arms"]
    rows = [["reference (bf16)", f"{arms['reference']['ppl']:.3f}"] + [""] * 7]
    order = ("w4a16-body", "w4a16+rtn-head", "artifact")  # the JSON's keys come back sorted
    for name in sorted((n for n in arms if n != "reference"), key=lambda n: (order.index(n) if n in order else 9, n)):
        a = arms[name]
        lo, hi = a["ci95_pct"]
        tail = [f"{a[k]:.4f}" if k in a else "" for k in ("kl_p99", "kl_p999")]  # reports written before the tail
        rows.append(
            [
                name,
                f"{a['ppl']:.3f}",
                _pct(a["delta_pct"]),
                f"[{_pct(lo)}, {_pct(hi)}]",
                f"{a['windows_worse']}/{a['windows']}",
                f"{a['kl']:.5f}",
                *tail,
                f"{100 * a['top1']:.2f}%",
            ]
        )
    return rows


def offline_table(report: dict[str, Any]) -> Any:
    """A rich Table of the offline figures."""
    from rich.table import Column, Table

    t = Table(
        Column(TABLE_COLUMNS[0], no_wrap=True),
        *TABLE_COLUMNS[1:],
        title=f"eval: {report['windows']} windows x {report['window_len']} tokens",
    )
    for row in table_rows(report):
        t.add_row(*row)
    return t


def markdown_table(report: dict[str, Any]) -> str:
    """The offline table as Markdown (the README's quality table)."""
    lines = ["| " + " | ".join(TABLE_COLUMNS) + " |", "|" + "---|" * len(TABLE_COLUMNS)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in table_rows(report)]) + "\n"


def kl_tail_line(t: dict[str, Any]) -> str:
    """The artifact's KL p99.9 with its interval and the windows and text it rests on."""
    lo, hi = t["ci95"]
    top = t["max"]
    text = f", after {top['text']!r}" if top.get("text") else ""
    return (
        f"artifact KL p99.9 {t['value']:.4f}, 95% bootstrap interval over windows [{lo:.4f}, {hi:.4f}]: its tail "
        f"tokens lie in {t['windows_above']} of {t['windows']} windows, {100 * t['top_window_share']:.0f}% of them "
        f"in window {t['top_window']}; the largest per-token KL {top['kl']:.4f} is at window {top['window']} token "
        f"{top['token']}{text}"
    )


def summary_lines(report: dict[str, Any]) -> list[str]:
    """lm_head and MTP lines, then one line per goal."""
    h = report["lm_head"]
    lines = [
        f"lm_head alone on held-out states: KL rtn {h['rtn']['kl']:.5f}, calibrated {h['gptq']['kl']:.5f} "
        f"(ratio {h['ratio']:.3f}), top-1 rtn {100 * h['rtn']['top1']:.2f}%, calibrated {100 * h['gptq']['top1']:.2f}%"
        if h.get("ratio") is not None
        else "lm_head: round-to-nearest KL is 0 (head not quantized?)"
    ]
    m = report["mtp"]
    if "reference" in m and "artifact" in m:
        lines.append(
            f"MTP first-draft agreement with greedy: reference {100 * m['reference']['agree']:.2f}%, "
            f"artifact {100 * m['artifact']['agree']:.2f}% (acceptance length at 1 draft "
            f"{m['reference']['acceptance_length_1']:.3f} -> {m['artifact']['acceptance_length_1']:.3f})"
        )
    if "int4_vs_bf16" in m:
        d = m["int4_vs_bf16"]
        lo, hi = d["ci95_points"]
        lines.append(
            f"MTP head on the artifact's states: bf16 {100 * m['artifact_bf16_mtp']['agree']:.2f}%, as shipped "
            f"{100 * m['artifact']['agree']:.2f}%: {d['delta_points']:+.2f} points, 95% CI (t) [{lo:+.2f}, {hi:+.2f}]"
            + (f"; the same first draft at {100 * d['same_draft']:.2f}% of positions" if "same_draft" in d else "")
        )
    lines += int8_lines(report)
    tail = report.get("arms", {}).get("artifact", {}).get("kl_p999_support")
    if tail:  # reports written before it lack it
        lines.append(kl_tail_line(tail))
    for name, g in report.get("goals", {}).items():
        lines.append(f"goal {name}: {g['value']:.3f} (limit {g['max']}) {'met' if g['met'] else 'NOT met'}")
    return lines


def int8_lines(report: dict[str, Any]) -> list[str]:
    """The int8-activation arm against the artifact (W4A16): perplexity, KL, top-1 and MTP (none without the arm)."""
    a = report.get("arms", {}).get("artifact+int8-act")
    if not a:
        return []
    v = a["vs_artifact"]
    lo, hi = v["ci95_pct"]
    line = (
        f"int8 activations vs the artifact (W4A16): perplexity {_pct(v['delta_pct'])} [{_pct(lo)}, {_pct(hi)}], "
        f"KL {v['kl']:.5f} (p99 {v['kl_p99']:.4f}, p99.9 {v['kl_p999']:.4f}), top-1 {100 * v['top1']:.2f}%"
    )
    m = report.get("mtp", {}).get("artifact+int8-act")
    if m:
        mlo, mhi = m["vs_artifact_ci95_points"]
        line += (
            f"; MTP first-draft agreement {100 * m['agree']:.2f}% ({m['vs_artifact_points']:+.2f} points, "
            f"95% CI (t) [{mlo:+.2f}, {mhi:+.2f}])"
        )
    return [line]
