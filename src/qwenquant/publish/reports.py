"""The reports whose figures may go on the card: only those keyed to this artifact's root digest.

Found beside the artifact where `qwenquant eval` writes them (evaluate.report.report_path: the offline
`eval` and the served `eval-served` report), plus any given with `--report` (a `qwenquant bench` JSON
names the artifact's root digest per served target; a `bench --depth`, `--soak` or `--turns` JSON of a
server started with `--serve ARTIFACT` names it for its one target: the evidence for a profile's
promise). A report of another root digest, or of a URL (no root digest), is refused.
Each report is published verbatim under qwenquant-reports/, so every figure can be checked.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qwenquant.errors import UsageError
from qwenquant.manifest import REPORTS_DIR

if TYPE_CHECKING:
    from qwenquant.bench.modes import BenchReport
    from qwenquant.evaluate.report import EvalReport

KINDS = ("eval", "eval-served", "bench", "bench-depth", "bench-soak", "bench-turns")
# `bench depth|soak|turns` (reports of schema 2 on); reports written before the subcommands name the flags
LONG = {f"qwenquant bench {how}{mode}": f"bench-{mode}" for mode in ("depth", "soak", "turns") for how in ("", "--")}


@dataclass(frozen=True)
class Report:
    """One report file: its kind, where it came from, where it goes in the repo, its bytes."""

    kind: str  # one of KINDS
    source: Path
    repo_path: str  # qwenquant-reports/<kind>[-n].json
    data: dict[str, Any]  # its JSON (eval: as its typed parts give it); read for reports written before typing
    # (eval before schema 1, bench before 2) and by eval's figures' JSON paths; a typed bench report's: `typed`
    raw: bytes
    typed: EvalReport | BenchReport | None = None  # None: a report written before schema_version 1

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.raw).hexdigest()


def report_kind(data: Any) -> str | None:
    """Which producer wrote this JSON (None: not a report qwenquant knows)."""
    if not isinstance(data, dict):
        return None
    if data.get("tool") == "qwenquant bench" and isinstance(data.get("targets"), list):
        return "bench"
    if data.get("tool") in LONG and isinstance(data.get("target"), dict):
        return LONG[data["tool"]]
    if isinstance(data.get("tasks"), list) and isinstance(data.get("mtp"), dict):
        return "eval-served"
    if isinstance(data.get("arms"), dict) and isinstance(data.get("lm_head"), dict):
        return "eval"
    return None


def report_digests(kind: str, data: dict[str, Any], typed: EvalReport | BenchReport | None = None) -> set[str]:
    """The artifact root digests a report was measured on (bench: one per served target): read from its
    typed report, or from its JSON as written before schema_version 1 (bench: before 2)."""
    from qwenquant.bench.modes import LongReport, RunReport
    from qwenquant.evaluate.report import OfflineReport, ServedReport

    if isinstance(typed, RunReport):
        return {t.artifact_root_digest for t in typed.targets if t.artifact_root_digest is not None}
    if isinstance(typed, LongReport):
        root = typed.target.artifact_root_digest
        return {root} if root is not None else set()
    if isinstance(typed, (OfflineReport, ServedReport)):
        return {typed.root_digest} if typed.root_digest is not None else set()
    if kind == "bench":
        return {
            t["artifact_root_digest"]
            for t in data["targets"]
            if isinstance(t, dict) and isinstance(t.get("artifact_root_digest"), str)
        }
    if kind in LONG.values():
        root = data["target"].get("artifact_root_digest")
        return {root} if isinstance(root, str) else set()
    return {data["root_digest"]} if isinstance(data.get("root_digest"), str) else set()


def typed_report(data: Any, source: str) -> EvalReport | BenchReport | None:
    """The typed report of a report's JSON, read as the loaders read a file (evaluate.report.load_report,
    bench.modes.load_report: another schema_version, an unknown mode or kind, or a field or part that is not
    the report's is exit 2). A report that names its mode (bench) or kind (eval), or a schema_version other
    than the first bench one, is typed; None for reports written before either (bench schema 1, eval before
    schema 1)."""
    if not isinstance(data, dict):
        return None
    if str(data.get("tool", "")).startswith("qwenquant bench"):
        if "mode" in data or data.get("schema_version") not in (None, 1):
            from qwenquant.bench.modes import BenchReport

            return BenchReport.from_json(data, source)
    elif "kind" in data or "schema_version" in data:
        from qwenquant.evaluate.report import EvalReport

        return EvalReport.from_json(data, source)
    return None


def read_report(raw: bytes, source: str) -> tuple[str | None, Any, EvalReport | BenchReport | None]:
    """(kind, JSON, typed report) of a report file's bytes, parsed once (those bytes are what is published):
    kind None when it is not a report qwenquant knows; a typed eval report's JSON is its typed parts' JSON.
    ValueError: not JSON; UsageError (exit 2): a typed report's check failed."""
    from qwenquant.evaluate.report import EvalReport

    data = json.loads(raw)
    typed = typed_report(data, source)
    if isinstance(typed, EvalReport):
        data = typed.to_json()
    return report_kind(data), data, typed


@dataclass(frozen=True)
class _Loaded:
    """One report file read and checked: its kind, its JSON (a typed eval report's as its parts give it), its
    bytes, its typed report (None: written before schema_version 1)."""

    kind: str
    path: Path
    data: dict[str, Any]
    raw: bytes
    typed: EvalReport | BenchReport | None

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.raw).hexdigest()


def _unverified_reference(loaded: _Loaded) -> bool:
    """An offline eval against a reference that is not the artifact's recorded source (--reference-unverified)."""
    from qwenquant.evaluate.report import OfflineReport

    if isinstance(loaded.typed, OfflineReport):
        return loaded.typed.reference_check.verified is False
    return loaded.kind == "eval" and (loaded.data.get("reference_check") or {}).get("verified") is False


def _load(path: Path, root_digest: str, artifact: Path) -> _Loaded:
    try:
        raw = path.read_bytes()
        kind, data, typed = read_report(raw, f"report {path}")
    except FileNotFoundError:
        raise UsageError(
            f"report {path} not found", hint="pass a report JSON written by `qwenquant eval` or `bench`"
        ) from None
    except (OSError, ValueError) as e:
        raise UsageError(
            f"report {path} is not readable JSON ({e})".splitlines()[0],
            hint="pass the JSON file `qwenquant eval` or `qwenquant bench` wrote",
        ) from None
    if kind is None:
        raise UsageError(
            f"{path} is not a qwenquant eval, served eval or bench report",
            hint="pass the JSON file `qwenquant eval` or `qwenquant bench` wrote",
        )
    _refuse_contradictions(kind, data, typed, path)
    digests = report_digests(kind, data, typed)
    if root_digest not in digests:
        what = (
            f"a report of root digest {sorted(digests)[0][:16]}..."
            if digests
            else "a report that names no artifact root digest (a bench of a URL: nothing says which artifact "
            "answered; measure with `--serve ARTIFACT`)"
        )
        raise UsageError(
            f"{path} is {what}, not of {artifact} ({root_digest[:16]}...): its figures cannot go on this card",
            hint="measure this artifact (`qwenquant eval` / `qwenquant bench run --serve ARTIFACT`) or drop --report",
        )
    loaded = _Loaded(kind, path, data, raw, typed)
    if _unverified_reference(loaded):
        raise UsageError(
            f"{path} compares against a reference that is not the artifact's recorded source "
            "(--reference-unverified): its figures cannot go on this card",
            hint="re-run `qwenquant eval offline ARTIFACT --reference SOURCE` with the recorded source",
        )
    return loaded


def _refuse_contradictions(kind: str, data: dict[str, Any], typed: EvalReport | BenchReport | None, path: Path) -> None:
    """A long bench report whose summary is not what its own records give (an edited `last_ok_depth`,
    `last_ok_turn`), or a soak verdict that is not the object soak writes: refused, the field named,
    before any figure of it goes on a card (field types of a typed report: its loader)."""
    from qwenquant.bench.modes import DepthReport, LongReport, TurnsReport

    have: Mapping[str, object] = data
    want: Mapping[str, object]
    if isinstance(typed, DepthReport):
        ok = [r.prompt_tokens for r in typed.rungs if r.ok]
        want = {"last_ok_depth": ok[-1] if ok else None}
        have = {"last_ok_depth": typed.last_ok_depth}
    elif isinstance(typed, TurnsReport):
        done = [t for t in typed.turns if t.ok]
        want = {"last_ok_turn": done[-1].turn if done else None, "last_ok_depth": done[-1].depth if done else None}
        have = {"last_ok_turn": typed.last_ok_turn, "last_ok_depth": typed.last_ok_depth}
    elif isinstance(typed, LongReport):
        return  # a typed soak's verdict is a SoakVerdict (its loader refused any other)
    elif kind in ("bench-depth", "bench-turns"):  # written before schema_version 2
        want = _summary_of_records(kind, data)
    else:
        verdict = data.get("verdict")
        if kind == "bench-soak" and not (isinstance(verdict, dict) and isinstance(verdict.get("status"), str)):
            raise UsageError(
                f"report {path}: verdict is {json.dumps(verdict)[:40]}, not an object with a `status` "
                "string as `qwenquant bench soak` writes it: the report was edited",
                hint="pass the report as `qwenquant bench` wrote it, or measure again",
            )
        return
    for key, value in want.items():
        if key in have and have[key] != value:
            raise UsageError(
                f"report {path}: {key} is {have[key]!r}, but its own records give {value!r}: the report was edited",
                hint="pass the report as `qwenquant bench` wrote it, or measure again",
            )


def _summary_of_records(kind: str, data: dict[str, Any]) -> dict[str, object]:
    """What the records of a depth or turns report written before schema_version 2 give its summary."""
    if kind == "bench-depth":
        ok = [r.get("prompt_tokens") for r in data.get("rungs") or [] if isinstance(r, dict) and r.get("ok")]
        return {"last_ok_depth": ok[-1] if ok else None}
    done = [t for t in data.get("turns") or [] if isinstance(t, dict) and t.get("ok")]
    return {
        "last_ok_turn": done[-1].get("turn") if done else None,
        "last_ok_depth": done[-1].get("depth") if done else None,
    }


def gather_reports(artifact: Path, root_digest: str, extra: Iterable[Path] = ()) -> list[Report]:
    """The reports beside the artifact for this root digest and those in `extra`, each checked,
    deduplicated by content, named in the repo by kind (order-independent)."""
    from qwenquant.evaluate.report import report_path

    paths = [p for p in (report_path(artifact, root_digest, "eval"),) if p.is_file()]
    beside = report_path(artifact, root_digest, "eval-served")  # and each served configuration's (served_kind)
    paths += sorted(beside.parent.glob(f"{artifact.resolve().name}.eval-served*-{root_digest[:16]}.json"))
    paths += [Path(p) for p in extra]
    seen: dict[str, _Loaded] = {}
    for p in paths:
        loaded = _load(p, root_digest, artifact)
        seen.setdefault(loaded.sha256, loaded)
    out: list[Report] = []
    for kind in KINDS:
        same = sorted((v for v in seen.values() if v.kind == kind), key=lambda v: v.sha256)
        for i, v in enumerate(same):
            name = f"{kind}.json" if i == 0 else f"{kind}-{i + 1}.json"
            out.append(Report(kind, v.path, f"{REPORTS_DIR}/{name}", v.data, v.raw, v.typed))
    return out
