"""Pinned Hub eval text sets: declared in `qwenquant/data/evaltext/*.yaml` (repo, 40-hex revision, file, sha256,
license), fetched through the project's verified fetch (the Hub-listed sha256 of the file at the
pinned commit; the declared sha256 too when set), cached, and read as one text.

The cache is `$XDG_CACHE_HOME/qwenquant/evaltext/<repo>@<revision>/` (quantize: `<work>/datasets/`);
a cached copy whose fetch record still verifies is used without the network.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from qwenquant import data_path, envs
from qwenquant.errors import FetchError, UsageError
from qwenquant.evaluate.reportparts import TextSource

log = logging.getLogger(__name__)

DEFAULT_TEXT_SET = "wikitext-2-test"
_HEX40 = re.compile(r"^[0-9a-f]{40}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_KEYS = {
    "schema_version",
    "name",
    "description",
    "repo",
    "repo_type",
    "revision",
    "file",
    "sha256",
    "text_field",
    "join",
    "license",
}


@dataclass(frozen=True)
class TextSet:
    """One declared eval text: a file of a Hub repo at a pinned commit."""

    name: str
    repo: str
    revision: str
    file: str
    license: str
    sha256: str | None = None
    repo_type: str = "dataset"
    text_field: str = "text"
    join: str = "\n\n"
    description: str = ""

    def describe(self) -> TextSource:
        """What a report records about the text (no local paths)."""
        return TextSource(
            text=self.name,
            text_set=self.name,
            repo=self.repo,
            revision=self.revision,
            file=self.file,
            sha256=self.sha256,
            license=self.license,
        )


def evaltext_dir() -> Path:
    """Shipped declarations: $QWENQUANT_EVALTEXT_DIR or the package's data/evaltext/."""
    return envs.get("QWENQUANT_EVALTEXT_DIR") or data_path("evaltext")


def _problems(raw: Mapping[str, object]) -> list[str]:
    p = [f"unknown key {k!r}" for k in sorted(set(raw) - _KEYS)]
    p += [f"{k}: required" for k in ("name", "repo", "revision", "file", "license") if not raw.get(k)]
    if raw.get("revision") and not _HEX40.match(str(raw["revision"])):
        p.append(f"revision: must be a full 40-hex commit sha (pinned), got {raw['revision']!r}")
    if raw.get("sha256") is not None and not _HEX64.match(str(raw["sha256"])):
        p.append(f"sha256: must be 64 hex digits or null, got {raw['sha256']!r}")
    if raw.get("repo_type", "dataset") not in ("dataset", "model"):
        p.append(f"repo_type: must be dataset or model, got {raw['repo_type']!r}")
    return p


def load_text_set(name_or_path: str | Path) -> TextSet:
    """A shipped declaration by name (`wikitext-2-test`) or a YAML path; UsageError lists every problem."""
    import yaml

    s = str(name_or_path)
    path = Path(s).expanduser() if s.endswith((".yaml", ".yml")) or os.sep in s else evaltext_dir() / f"{s}.yaml"
    if not path.is_file():
        shipped = sorted(p.stem for p in evaltext_dir().glob("*.yaml")) if evaltext_dir().is_dir() else []
        raise UsageError(
            f"no eval text set {s!r} ({path} not found)",
            hint=f"shipped: {', '.join(shipped) or '(none)'}; or pass --text FILE",
        )
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise UsageError(f"cannot read eval text set {path}: {e}".splitlines()[0], hint="fix the YAML") from None
    problems = _problems(raw) if isinstance(raw, dict) else ["(top level): must be a mapping"]
    if problems:
        raise UsageError(f"eval text set {path} is invalid: " + "; ".join(problems), hint="fix each field named")
    return TextSet(**{k: v for k, v in raw.items() if k != "schema_version"})


def cache_root() -> Path:
    """Where `qwenquant eval` keeps fetched text sets."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "qwenquant" / "evaltext"


def _cached(folder: Path, ts: TextSet) -> bool:
    from qwenquant.errors import VerificationError
    from qwenquant.fetch import check_fetch_record

    try:
        check = check_fetch_record(folder)
    except VerificationError:
        return False
    return check.ok and check.record.get("commit") == ts.revision and (folder / ts.file).is_file()


def fetch_text_set(ts: TextSet, cache: Path | None = None) -> Path:
    """The verified local copy of the set's file (fetched once, then reused from the cache)."""
    from qwenquant.hashing import sha256_file

    folder = (cache or cache_root()) / f"{ts.repo.replace('/', '--')}@{ts.revision}"
    if not _cached(folder, ts):
        from qwenquant.fetch import fetch_snapshot

        log.info("fetching eval text %s: %s@%s %s", ts.name, ts.repo, ts.revision[:12], ts.file)
        try:
            fetch_snapshot(
                ts.repo, folder, revision=ts.revision, repo_type=ts.repo_type, only=(ts.file,), check_model=False
            )
        except FetchError as e:
            raise FetchError(
                f"the eval text set {ts.name} ({ts.repo}@{ts.revision[:12]}, {ts.file}) could not be "
                f"fetched: {e.message}",
                hint="check the network and HF_ENDPOINT, or evaluate on a local file: --text FILE",
            ) from e
    path = folder / ts.file
    seen = sha256_file(path)
    if ts.sha256 is not None and seen != ts.sha256:
        raise FetchError(
            f"{path}: sha256 {seen} is not the declared {ts.sha256} of eval text set {ts.name}",
            hint="the declaration or the Hub file changed: check the revision and sha256 it declares",
        )
    if ts.sha256 is None:
        log.info(
            "eval text %s: sha256 %s (verified against the Hub listing; not pinned in its declaration)", ts.name, seen
        )
    return path


def read_text(path: Path, ts: TextSet) -> str:
    """The file's text: the `text_field` column of a parquet/jsonl file joined by `join`, or a .txt file."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        rows = pq.read_table(path, columns=[ts.text_field]).column(ts.text_field).to_pylist()
    elif path.suffix == ".jsonl":
        import json

        rows = [
            json.loads(line)[ts.text_field] for line in path.read_text(encoding="utf-8").splitlines() if line.strip()
        ]
    else:
        return path.read_text(encoding="utf-8")
    return ts.join.join(str(r) for r in rows if r is not None)
