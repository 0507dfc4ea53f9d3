"""The artifact manifest: every file's size and sha256, a root digest, and what produced them.

`qwenquant-manifest.json` sits in the artifact root and is written last. It is tamper-evident,
not signed: `root_digest` covers the file list and the recipe (whose serve profiles say what `serve`
launches: the digest a user pins with `fetch --root` pins them too) and `manifest_self_digest` covers the
whole manifest body (source, stages, ...), so an edit anywhere shows up in `verify_artifact`. A manifest
of schema_version 1 (root digest over the file list alone) is refused with a line saying to rebuild.

A published or fetched folder also holds companions vLLM never loads, outside the hashed file set
(the root digest is untouched): the fetch record, the Hub's .gitattributes, a model_signing
signature, and the card record `qwenquant-card.json` (sealed by `card_self_digest`, naming this
root digest and manifest self digest) with the files it records by sha256: the model card README.md
and the reports under qwenquant-reports/ (and, when it names one, the signature, which must then be
there). Any other file the manifest does not list is a problem.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qwenquant.atomic import atomic_write_bytes, canonical_json
from qwenquant.errors import VerificationError
from qwenquant.hashing import artifact_root_digest, sha256_files, sha256_json
from qwenquant.manifest_form import (  # the record and its JSON form (manifest_form.py)
    HEX64,
    MANIFEST_NAME,
    FileDigest,
    Manifest,
    manifest_from_dict,
    manifest_self_digest,
)

log = logging.getLogger(__name__)

CARD_NAME, CARD_RECORD_NAME, REPORTS_DIR = "README.md", "qwenquant-card.json", "qwenquant-reports"
SIGNATURE_NAME, FETCH_RECORD_NAME = "model.sig", "qwenquant-fetch.json"
UNCHECKED_COMPANIONS = (FETCH_RECORD_NAME, SIGNATURE_NAME, ".gitattributes")  # checked by fetch, --signature, git
_REPORT_PATH = re.compile(rf"^{REPORTS_DIR}/[a-z0-9][a-z0-9.-]*\.json$")


def compute_root_digest(files: Iterable[FileDigest], recipe_sha256: str) -> str:
    """The root digest over the file list and the recipe (formula: hashing.artifact_root_digest)."""
    return artifact_root_digest(files, recipe_sha256)


def list_artifact_files(artifact_dir: Path) -> dict[str, Path]:
    """Relative POSIX path -> file, for every file under the folder except the manifest."""
    root = Path(artifact_dir)
    out: dict[str, Path] = {}
    for p in root.rglob("*"):
        if p.is_file():
            rel = p.relative_to(root).as_posix()
            if rel != MANIFEST_NAME:
                out[rel] = p
    return dict(sorted(out.items()))  # string order ("a-b" < "a/b"), not pathlib's part order


def _hash_with_progress(paths: list[Path], label: str) -> dict[Path, str]:
    from qwenquant.console import byte_progress

    total = sum(p.stat().st_size for p in paths)
    with byte_progress() as progress:
        task = progress.add_task(label, total=total, files=f"{len(paths)} files")
        return sha256_files(paths, progress=lambda n: progress.advance(task, n))


def _jsonable(obj: Any, what: str) -> Any:
    try:
        return json.loads(canonical_json(obj))
    except (TypeError, ValueError) as e:
        raise ValueError(f"manifest field {what!r} is not JSON-serialisable: {e}") from e


def build_manifest(
    artifact_dir: Path,
    *,
    source: dict[str, Any],
    recipe: dict[str, Any],
    recipe_sha256: str,
    calibration: dict[str, Any],
    stages: dict[str, Any],
    quality: dict[str, Any],
    tool_versions: dict[str, Any],
    extra: dict[str, Any] | None = None,
    hasher: Callable[[list[Path]], dict[Path, str]] | None = None,
) -> Manifest:
    """Hash every file in `artifact_dir` (in parallel) and describe it; nothing is written.

    `hasher(paths) -> {path: sha256}`: how the files are hashed (default: read them all, with a
    progress bar); the quantize pipeline passes its stage records' cache (quantize/records.py)."""
    root = Path(artifact_dir)
    if not root.is_dir():
        raise VerificationError(
            f"{root} is not a folder" if root.exists() else f"artifact folder not found: {root}",
            hint="pass the artifact folder (the one holding qwenquant-manifest.json)",
        )
    recipe = _jsonable(recipe, "recipe")
    if sha256_json(recipe) != recipe_sha256:
        raise ValueError(
            "recipe_sha256 is not the sha256 of the canonical recipe: pass recipe.canonical() "
            "and recipe.sha256() of the same Recipe"
        )
    files = list_artifact_files(root)
    digests = (hasher or (lambda paths: _hash_with_progress(paths, "hashing")))(list(files.values()))
    entries = tuple(FileDigest(rel, p.stat().st_size, digests[p]) for rel, p in files.items())
    log.debug("hashed %d files under %s", len(entries), root)
    return Manifest(
        files=entries,
        root_digest=compute_root_digest(entries, recipe_sha256),
        source=_jsonable(source, "source"),
        recipe=recipe,
        recipe_sha256=recipe_sha256,
        calibration=_jsonable(calibration, "calibration"),
        stages=_jsonable(stages, "stages"),
        quality=_jsonable(quality, "quality"),
        tool_versions=_jsonable(tool_versions, "tool_versions"),
        extra=_jsonable(extra or {}, "extra"),
    )


def write_manifest(artifact_dir: Path, manifest: Manifest) -> Path:
    """Write the manifest atomically into the artifact root (do this last)."""
    path = Path(artifact_dir) / MANIFEST_NAME
    atomic_write_bytes(path, canonical_json(manifest.to_dict()))
    return path


def load_manifest(artifact_dir: Path) -> Manifest:
    """Read and structurally validate `qwenquant-manifest.json` (digests are checked by verify)."""
    path = Path(artifact_dir) / MANIFEST_NAME
    if not Path(artifact_dir).is_dir():
        raise VerificationError(
            f"{artifact_dir} is not a folder"
            if Path(artifact_dir).exists()
            else f"artifact folder not found: {artifact_dir}",
            hint="pass the artifact folder (the one holding qwenquant-manifest.json)",
        )
    try:
        d = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise VerificationError(
            f"no {MANIFEST_NAME} in {artifact_dir}",
            hint="the artifact is unfinished or not a qwenquant artifact; re-run `qwenquant quantize`",
        ) from None
    except (ValueError, UnicodeDecodeError) as e:
        raise VerificationError(
            f"{MANIFEST_NAME} is not valid JSON: {e}",
            hint="the manifest was edited or truncated; rebuild or restore it",
        ) from None
    return manifest_from_dict(d)


@dataclass(frozen=True)
class FileProblem:
    """One mismatch: status is missing | extra | changed | unreadable | manifest."""

    path: str
    status: str
    detail: str
    expected_size: int | None = None
    actual_size: int | None = None

    def __str__(self) -> str:
        return f"{self.path}: {self.status} ({self.detail})"


@dataclass(frozen=True)
class VerifyReport:
    """Result of re-hashing an artifact against its manifest."""

    artifact_dir: str
    root_digest: str
    files_checked: int
    bytes_checked: int
    problems: tuple[FileProblem, ...]
    companions: tuple[str, ...] = ()  # accepted files beside the manifest's (module doc)
    card: dict[str, Any] | None = None  # the card record, when it checks out

    @property
    def published_as(self) -> str | None:
        """The repo the card record names (None without a valid card record)."""
        return self.card.get("repo_id") if self.card else None

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def bad_files(self) -> list[str]:
        return sorted({p.path for p in self.problems})

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "artifact_dir": self.artifact_dir,
            "root_digest": self.root_digest,
            "files_checked": self.files_checked,
            "bytes_checked": self.bytes_checked,
            "problems": [
                {
                    "path": p.path,
                    "status": p.status,
                    "detail": p.detail,
                    "expected_size": p.expected_size,
                    "actual_size": p.actual_size,
                }
                for p in self.problems
            ],
            "companions": list(self.companions),
            "published_as": self.published_as,
        }


def _manifest_problems(m: Manifest, raw: dict[str, Any]) -> list[FileProblem]:
    out: list[FileProblem] = []
    if compute_root_digest(m.files, m.recipe_sha256) != m.root_digest:
        out.append(
            FileProblem(
                MANIFEST_NAME,
                "manifest",
                "root_digest does not match the manifest's own file list and recipe: the manifest was edited",
            )
        )
    if manifest_self_digest(raw) != raw["manifest_self_digest"]:
        out.append(
            FileProblem(
                MANIFEST_NAME,
                "manifest",
                "manifest_self_digest does not match the manifest body: the manifest was edited",
            )
        )
    if sha256_json(m.recipe) != m.recipe_sha256:
        out.append(FileProblem(MANIFEST_NAME, "manifest", "recipe_sha256 does not match the recorded recipe"))
    return out


def compare_files(
    expected: tuple[FileDigest, ...],
    actual: dict[str, Path],
    hasher: Callable[[list[Path]], dict[Path, str]],
) -> list[FileProblem]:
    """Missing, extra and changed files; only files whose size matches are hashed."""
    out: list[FileProblem] = []
    want = {f.path: f for f in expected}
    for rel in sorted(set(want) - set(actual)):
        out.append(FileProblem(rel, "missing", "listed in the manifest, not on disk", want[rel].size, None))
    for rel in sorted(set(actual) - set(want)):
        out.append(FileProblem(rel, "extra", "on disk, not in the manifest", None, actual[rel].stat().st_size))
    to_hash: list[tuple[FileDigest, Path]] = []
    for rel in sorted(set(want) & set(actual)):
        size = actual[rel].stat().st_size
        if not os.access(actual[rel], os.R_OK):
            out.append(FileProblem(rel, "unreadable", "no read permission", want[rel].size, size))
        elif size != want[rel].size:
            out.append(FileProblem(rel, "changed", f"size {size} != {want[rel].size}", want[rel].size, size))
        else:
            to_hash.append((want[rel], actual[rel]))
    digests = hasher([p for _, p in to_hash])
    for f, p in to_hash:
        if digests[p] != f.sha256:
            out.append(
                FileProblem(f.path, "changed", f"sha256 {digests[p][:12]}... != {f.sha256[:12]}...", f.size, f.size)
            )
    return sorted(out, key=lambda x: (x.path, x.status))


def card_record_problem(rec: Any, manifest: Manifest, raw: dict[str, Any]) -> str | None:
    """Why a parsed qwenquant-card.json cannot vouch for its files beside this manifest (None: it can)."""
    from qwenquant.hashing import is_sealed

    if not is_sealed(rec, "card_self_digest") or rec.get("schema_version") != 1:
        return "not a sealed schema 1 card record (card_self_digest does not match its body)"
    if rec.get("root_digest") != manifest.root_digest or rec.get("manifest_self_digest") != raw["manifest_self_digest"]:
        return f"names root digest {str(rec.get('root_digest'))[:16]}..., not this manifest's {manifest.root_digest[:16]}..."
    files = rec.get("files")
    if not isinstance(files, dict) or CARD_NAME not in files:
        return f"does not record {CARD_NAME}"
    for rel, f in files.items():
        if (
            (rel != CARD_NAME and not _REPORT_PATH.match(rel))
            or not isinstance(f, dict)
            or not HEX64.match(str(f.get("sha256")))
        ):
            return f"records {rel!r}, which is not {CARD_NAME} or a {REPORTS_DIR}/*.json report with a sha256"
    return None


def _companion_problems(
    manifest: Manifest, raw: dict[str, Any], extra: dict[str, Path]
) -> tuple[list[FileProblem], list[str], dict[str, Any] | None]:
    """Problems of the companions among `extra` (unlisted files), those accepted, the card record if it checks out."""
    from qwenquant.hashing import sha256_file

    accepted = [rel for rel in UNCHECKED_COMPANIONS if rel in extra]
    if CARD_RECORD_NAME not in extra:
        return [], accepted, None
    accepted.append(CARD_RECORD_NAME)
    try:
        rec = json.loads(extra[CARD_RECORD_NAME].read_bytes())
    except (OSError, ValueError) as e:
        rec = f"unreadable ({e})"
    why = card_record_problem(rec, manifest, raw) if isinstance(rec, dict) else str(rec)
    if why:
        return [FileProblem(CARD_RECORD_NAME, "card", why)], accepted, None
    problems = []
    if rec.get("signature") == SIGNATURE_NAME and SIGNATURE_NAME not in extra:
        problems.append(
            FileProblem(
                SIGNATURE_NAME,
                "missing",
                f"named in {CARD_RECORD_NAME}, not on disk: the published signature was removed",
            )
        )
    for rel, f in sorted(rec["files"].items()):
        if rel not in extra:
            problems.append(FileProblem(rel, "missing", f"recorded in {CARD_RECORD_NAME}, not on disk"))
        elif sha256_file(extra[rel]) != f["sha256"]:
            problems.append(
                FileProblem(rel, "card", f"sha256 differs from {CARD_RECORD_NAME}: edited after publishing")
            )
        accepted.append(rel)
    return problems, accepted, (None if problems else rec)


def verify_artifact(artifact_dir: Path) -> VerifyReport:
    """Re-hash every file (in parallel) and compare with the manifest; the manifest is checked too,
    and so are the card files a card record vouches for (see the module doc)."""
    root = Path(artifact_dir)
    manifest = load_manifest(root)
    raw = json.loads((root / MANIFEST_NAME).read_bytes())
    problems = _manifest_problems(manifest, raw)
    actual = list_artifact_files(root)
    listed = {f.path for f in manifest.files}
    card_problems, companions, card = _companion_problems(
        manifest, raw, {rel: p for rel, p in actual.items() if rel not in listed}
    )
    problems += card_problems + compare_files(
        manifest.files,
        {k: v for k, v in actual.items() if k not in companions},
        lambda paths: _hash_with_progress(paths, "verifying"),
    )
    checked = [
        f for f in manifest.files if f.path in actual and os.access(actual[f.path], os.R_OK)
    ]  # read, not missing
    return VerifyReport(
        str(root),
        manifest.root_digest,
        len(checked),
        sum(actual[f.path].stat().st_size for f in checked),
        tuple(sorted(problems, key=lambda x: (x.path, x.status))),
        tuple(sorted(companions)),
        card,
    )
