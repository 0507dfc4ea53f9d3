"""The card is a function of the manifest and the reports: re-derive it and compare (pure but for reading files).

`manifest.verify_artifact` checks the card files' sha256 against the card record; anyone who edits the
card can update that record and re-seal it. So a card of this qwenquant's format (`card.CARD_FORMAT`)
is built again from the manifest, the artifact's config and index, the published reports and the
record's repo, revision, license and signature, and must equal README.md and the record byte for byte
(the first differing line is named). A card of another format cannot be re-derived and is refused: a
weaker check for it would let anyone who strips the format from a record edit the card unseen.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from qwenquant.errors import QwenquantError, UsageError
from qwenquant.manifest import CARD_NAME, CARD_RECORD_NAME, MANIFEST_NAME, FileProblem, VerifyReport, load_manifest
from qwenquant.publish.reports import KINDS, Report, read_report, report_digests

_NUMBERED = re.compile(r"-(\d+)\.json$")


def verify_published_artifact(artifact: Path) -> VerifyReport:
    """`manifest.verify_artifact`, then (when a card record vouches for a card) the card re-derived."""
    import dataclasses

    from qwenquant.manifest import verify_artifact

    report = verify_artifact(artifact)
    if not report.ok or report.card is None:
        return report
    problems = card_problems(Path(artifact), report.card)
    if not problems:
        return report
    return dataclasses.replace(report, problems=tuple(sorted(problems, key=lambda x: (x.path, x.status))), card=None)


def _reports(artifact: Path, files: Iterable[str], root: str) -> tuple[list[Report], list[FileProblem]]:
    """The published reports the card record names (`files`, README.md aside), each read as publish reads it."""
    out, problems = [], []
    for rel in sorted(p for p in files if p != CARD_NAME):
        raw = (artifact / rel).read_bytes()
        try:
            kind, data, typed = read_report(raw, rel)
        except ValueError:
            kind, data, typed = None, None, None
        except UsageError as e:  # a typed report whose check failed: another schema_version, a field edited
            problems.append(FileProblem(rel, "card", e.message))
            continue
        if kind is None:
            problems.append(FileProblem(rel, "card", "not a qwenquant eval, served eval or bench report"))
        elif root not in report_digests(kind, data, typed):
            problems.append(
                FileProblem(
                    rel,
                    "card",
                    f"a report of another root digest than {root[:16]}...: its figures do not describe this artifact",
                )
            )
        else:
            out.append(Report(kind, artifact / rel, rel, data, raw, typed))

    def order(r: Report) -> tuple[int, int]:
        m = _NUMBERED.search(r.repo_path)
        return KINDS.index(r.kind), int(m.group(1)) if m else 1

    return sorted(out, key=order), problems


def front_license(readme: str) -> str:
    import yaml

    try:
        meta = yaml.safe_load(readme[4:].split("\n---", 1)[0]) if readme.startswith("---\n") else None
    except yaml.YAMLError:
        meta = None
    return str((meta or {}).get("license") or "other") if isinstance(meta, dict) else "other"


def first_difference(have: str, want: str) -> tuple[int, str, str] | None:
    """(line number, the line on disk, the derived line) of the first difference; None when equal."""
    a, b = have.splitlines(), want.splitlines()
    for i in range(max(len(a), len(b))):
        x, y = (a[i] if i < len(a) else "<end of file>"), (b[i] if i < len(b) else "<end of file>")
        if x != y:
            return i + 1, x, y
    return None if have == want else (len(a) + 1, "<end of file>", "")


def _card_inputs(rec: dict[str, Any], readme: str) -> tuple[str, str, str, bool]:
    """What the card is derived from of its record (read once its format is this qwenquant's): the repo,
    revision, license and whether it is signed, from the typed record; from a record that is not one (a key
    or a type of its own: it differs from the derived record, named after README.md's check), as written."""
    from pydantic import ValidationError

    from qwenquant.publish.records import CardRecord

    try:
        typed = CardRecord.model_validate(rec)
    except ValidationError:
        named = rec.get("license")
        license_id = named if isinstance(named, str) else front_license(readme)
        return str(rec.get("repo_id")), str(rec.get("revision")), license_id, bool(rec.get("signature"))
    return typed.repo_id, typed.revision, typed.license, bool(typed.signature)


def card_problems(artifact: Path, rec: dict[str, Any]) -> list[FileProblem]:
    """How README.md and the card record differ from what the manifest and the reports give."""
    from qwenquant.publish.card import CARD_FORMAT, build_card, read_facts
    from qwenquant.publish.figures import collect_figures, not_measured

    manifest = load_manifest(artifact)
    raw = json.loads((artifact / MANIFEST_NAME).read_bytes())
    readme = (artifact / CARD_NAME).read_bytes()
    reports, problems = _reports(artifact, rec["files"], manifest.root_digest)
    if problems:
        return problems
    figures = collect_figures(manifest, reports, manifest.root_digest)
    if rec.get("card_format") != CARD_FORMAT:  # a record stripped of it must not buy a weaker check
        return [
            FileProblem(
                CARD_RECORD_NAME,
                "card",
                f"card format {rec.get('card_format')!r}, not {CARD_FORMAT}: "
                "this qwenquant cannot re-derive that card, so its figures and "
                "descriptions cannot be checked (re-publish it with this "
                "qwenquant, or verify with the qwenquant that published it)",
            )
        ]
    repo_id, revision, license_id, signed = _card_inputs(rec, readme.decode())
    try:
        facts = read_facts(artifact, manifest, license_id)
    except (QwenquantError, OSError, ValueError) as e:
        return [FileProblem(CARD_NAME, "card", f"cannot be derived from the artifact's config and index: {e}")]
    card = build_card(
        manifest,
        raw["manifest_self_digest"],
        facts,
        repo_id=repo_id,
        revision=revision,
        license_id=license_id,
        reports=reports,
        figures=figures,
        missing=not_measured(figures),
        signed=signed,
    )
    diff = first_difference(readme.decode(errors="replace"), card.readme.decode())
    if diff:
        n, have, want = diff
        return [
            FileProblem(
                CARD_NAME,
                "card",
                f"line {n} differs from what the manifest and reports give: {have[:120]!r}, derived {want[:120]!r}",
            )
        ]
    derived = card.record.to_json()
    if derived != rec:
        keys = sorted(k for k in set(derived) | set(rec) if derived.get(k) != rec.get(k))
        return [
            FileProblem(CARD_RECORD_NAME, "card", f"{', '.join(keys)} differ from what the manifest and reports give")
        ]
    return []
