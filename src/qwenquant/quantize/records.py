"""Stage completion records: when a stage may be skipped, and how its record is written.

`<work>/<stage>.record.json`:

    {stage, status: "complete", inputs: {name: sha256}, outputs: {relpath: sha256}, params,
     result, started, finished, tool_versions, schema_version, record_sha256}

`record_sha256` is the sha256 of the canonical JSON of every other field. A stage is skipped only
when its record parses, is complete, hashes to its own `record_sha256`, has the same inputs and
params as now, and every output file on disk still has its recorded sha256 (and none was added).
The pipeline is the only writer; `quantize --plan` (status.py) only checks.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qwenquant.atomic import atomic_write_bytes, canonical_json, exclusive_lock, pretty_json, staging_dir
from qwenquant.errors import UsageError
from qwenquant.hashing import DigestCache, self_digest, sha256_json

log = logging.getLogger("qwenquant.quantize.pipeline")

RECORD_SCHEMA = 1
_RECORD_FIELDS = {
    "schema_version": int,
    "stage": str,
    "status": str,
    "inputs": dict,
    "outputs": dict,
    "params": dict,
    "result": dict,
    "started": str,
    "finished": str,
    "tool_versions": dict,
    "record_sha256": str,
}


def record_digest(body: dict[str, Any]) -> str:
    """The self-hash of a record: sha256 of the canonical JSON without `record_sha256`."""
    return self_digest(body, "record_sha256")


def outputs_digest(record: dict[str, Any]) -> str:
    """One digest naming a stage's outputs (what later stages list as their input)."""
    return sha256_json(record["outputs"])


def tool_versions() -> dict[str, str]:
    """Installed versions of the quantization stack (package metadata only: no heavy imports)."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for dist in (
        "qwenquant",
        "torch",
        "transformers",
        "llmcompressor",
        "compressed-tensors",
        "datasets",
        "safetensors",
    ):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = "not installed"
    return out


def _now() -> str:
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1e6):06d}Z"


def check_record(
    raw: bytes | None,
    *,
    stage: str,
    inputs: dict[str, str],
    params: dict[str, Any],
    outputs_on_disk: Callable[[], dict[str, str]],
) -> tuple[dict[str, Any] | None, str]:
    """Pure-ish: (record, "") when the stage may be skipped, else (None, why it must run)."""
    if raw is None:
        return None, "no completion record"
    try:
        rec = json.loads(raw)
    except ValueError:
        return None, "completion record is not valid JSON (partial or corrupt)"
    if not isinstance(rec, dict):
        return None, "completion record is malformed (not an object)"
    bad = [k for k, t in _RECORD_FIELDS.items() if not isinstance(rec.get(k), t)]
    if bad:
        return None, f"completion record is malformed (fields {', '.join(bad)})"
    if rec["schema_version"] != RECORD_SCHEMA or rec["stage"] != stage or rec["status"] != "complete":
        return None, "completion record is not a complete record of this stage"
    if not all(isinstance(v, str) for v in rec["outputs"].values()) or not all(
        isinstance(v, str) for v in rec["inputs"].values()
    ):
        return None, "completion record is malformed (digests)"
    if record_digest(rec) != rec["record_sha256"]:
        return None, "completion record fails its self-hash"
    if rec["inputs"] != inputs:
        changed = sorted(k for k in set(inputs) | set(rec["inputs"]) if inputs.get(k) != rec["inputs"].get(k))
        return None, f"inputs changed ({', '.join(changed)})"
    now = json.loads(canonical_json(params))
    if rec["params"] != now:
        changed = sorted(k for k in set(now) | set(rec["params"]) if now.get(k) != rec["params"].get(k))
        return None, f"parameters changed ({', '.join(changed)})"
    on_disk = outputs_on_disk()
    if on_disk != rec["outputs"]:
        changed = sorted(k for k in set(on_disk) | set(rec["outputs"]) if on_disk.get(k) != rec["outputs"].get(k))
        return None, f"outputs changed on disk ({', '.join(changed[:3])}{'...' if len(changed) > 3 else ''})"
    return rec, ""


@dataclass
class StageOutcome:
    name: str
    dir: Path
    record: dict[str, Any]
    ran: bool
    reason: str

    @property
    def result(self) -> dict[str, Any]:
        return self.record["result"]

    @property
    def digest(self) -> str:
        return outputs_digest(self.record)


class StageRunner:
    """Runs a stage unless its record proves it complete; writes the record afterwards."""

    def __init__(self, work: Path) -> None:
        self.work = Path(work)
        self.digests = DigestCache()
        self.versions = tool_versions()
        self.outcomes: dict[str, StageOutcome] = {}

    def record_path(self, name: str) -> Path:
        return self.work / f"{name}.record.json"

    def check(self, name: str, inputs: dict[str, str], params: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
        """(record, "") when stage `name` may be skipped, else (None, why it must run); reads only."""
        path = self.record_path(name)
        raw = path.read_bytes() if path.is_file() else None
        return check_record(
            raw, stage=name, inputs=inputs, params=params, outputs_on_disk=lambda: self.digests.folder(self.work / name)
        )

    def intact_record(self, name: str) -> dict[str, Any] | None:
        """Stage `name`'s record when it is whole and its outputs on disk are the ones it lists, whatever
        inputs and params it was made with (None otherwise); reads only."""
        path = self.record_path(name)
        if not path.is_file():
            return None
        try:
            rec = json.loads(path.read_bytes())
        except ValueError:
            return None
        if (
            not isinstance(rec, dict)
            or not isinstance(rec.get("inputs"), dict)
            or not isinstance(rec.get("params"), dict)
        ):
            return None
        ok, _ = self.check(name, rec["inputs"], rec["params"])
        return ok

    def run(
        self, name: str, inputs: dict[str, str], params: dict[str, Any], fn: Callable[[Path], dict[str, Any]]
    ) -> StageOutcome:
        out_dir = self.work / name
        path = self.record_path(name)
        rec, reason = self.check(name, inputs, params)
        if rec is not None:
            log.info("stage %s: complete, skipped", name)
            outcome = StageOutcome(name, out_dir, rec, False, "")
        else:
            log.info("stage %s: running (%s)", name, reason)
            path.unlink(missing_ok=True)
            started = _now()
            with staging_dir(out_dir) as tmp:
                result = fn(tmp)
            body = {
                "schema_version": RECORD_SCHEMA,
                "stage": name,
                "status": "complete",
                "inputs": inputs,
                "outputs": self.digests.folder(out_dir),
                "params": json.loads(canonical_json(params)),
                "result": json.loads(canonical_json(result or {})),
                "started": started,
                "finished": _now(),
                "tool_versions": self.versions,
            }
            body["record_sha256"] = record_digest(body)
            atomic_write_bytes(path, pretty_json(body))
            log.info("stage %s: complete", name)
            outcome = StageOutcome(name, out_dir, body, True, reason)
        self.outcomes[name] = outcome
        return outcome


def work_lock(work: Path) -> contextlib.AbstractContextManager[None]:
    """One quantize per work folder (flock: released by the kernel if the process dies)."""
    work.mkdir(parents=True, exist_ok=True)
    busy = UsageError(
        f"another quantize is running with work folder {work}", hint="wait for it, or pass a different --work"
    )
    return exclusive_lock(work / ".lock", busy)


def clean_partials(work: Path) -> None:
    """Remove staging folders a killed run left behind (they are never trusted)."""
    for p in work.glob(".*.partial"):
        shutil.rmtree(p, ignore_errors=True)
    for p in work.glob(".*.old-*"):
        shutil.rmtree(p, ignore_errors=True)
