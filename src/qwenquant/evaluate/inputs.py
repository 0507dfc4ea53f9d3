"""What `qwenquant eval` checks before it measures: the artifact verifies, the reference is the source
its manifest records (or the user said it need not be), both models have the same shapes, and the
report can be written without silently replacing a report of another run."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qwenquant.errors import UsageError, VerificationError

if TYPE_CHECKING:
    from qwenquant.evaluate.reportparts import ReferenceCheck

log = logging.getLogger(__name__)

# text-config sizes both arms must share (a reference of another model fails on them, not in a matmul)
SHAPE_KEYS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "layer_types",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "mtp_num_hidden_layers",
)
UNVERIFIED_FLAG = "--reference-unverified"


def verify_artifact_first(artifact: Path) -> str:
    """The artifact's root digest, after `verify` passes (VerificationError, exit 4, otherwise)."""
    from qwenquant.manifest import verify_artifact

    report = verify_artifact(artifact)
    if not report.ok:
        first = report.problems[0] if report.problems else "no manifest"
        raise VerificationError(
            f"{artifact} does not verify ({len(report.problems)} problem(s); first: {first})",
            hint=f"run `qwenquant verify {artifact}` for the list; eval measures only a verified artifact",
        )
    return report.root_digest


def check_reference(artifact: Path, reference: Path, *, unverified: bool) -> ReferenceCheck:
    """Prove `reference` is the source the manifest records (every recorded file, by sha256), unless
    `unverified`; then compare both configs' sizes. Returns the report's `reference_check` section."""
    from qwenquant.checkpoint.config import read_config, text_config
    from qwenquant.evaluate.reportparts import ReferenceCheck
    from qwenquant.manifest import load_manifest

    if not reference.is_dir():
        raise UsageError(f"--reference {reference}: folder not found", hint="pass the bf16 source checkpoint folder")
    recorded = load_manifest(artifact).source
    what = (recorded.get("repo") or "a local folder") + (
        f" at commit {recorded['commit']}" if recorded.get("commit") else ""
    )
    if unverified:
        log.warning(
            "--reference %s is NOT checked against the source that %s's manifest records (%s): the figures "
            "compare two models you chose",
            reference,
            artifact,
            UNVERIFIED_FLAG,
        )
        section = ReferenceCheck(verified=False, recorded_source=what)
    else:
        section = ReferenceCheck(verified=True, recorded_source=what, files=_prove(reference, recorded, what))
    ref_cfg, art_cfg = text_config(read_config(reference)), text_config(read_config(artifact))
    for key in SHAPE_KEYS:
        if ref_cfg.get(key) != art_cfg.get(key):
            raise UsageError(
                f"--reference {reference}: config.json {key} is {_short(ref_cfg.get(key))}, the "
                f"artifact's is {_short(art_cfg.get(key))}: not the same model",
                hint=f"pass the source {artifact} was quantized from ({what})",
            )
    return section


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _prove(reference: Path, recorded: Mapping[str, Any], what: str) -> int:
    """Hash every file the manifest records for the source; return how many were compared."""
    from qwenquant.hashing import sha256_files

    files = recorded.get("files") or {}
    hint = (
        f"pass the folder the artifact was quantized from ({what}), or {UNVERIFIED_FLAG} to compare "
        "against another checkpoint anyway (the report says so)"
    )
    if not files:
        raise VerificationError(
            f"the artifact's manifest records no source files, so --reference {reference} cannot be checked", hint=hint
        )
    paths = {}
    for rel in sorted(files):
        p = reference / rel
        if not p.is_file():
            raise VerificationError(f"--reference {reference}: {rel} is missing (a file of {what})", hint=hint)
        if p.stat().st_size != files[rel].get("size"):
            raise VerificationError(
                f"--reference {reference}: {rel} is {p.stat().st_size:,} bytes, the source's "
                f"is {files[rel].get('size'):,}: not the source of this artifact",
                hint=hint,
            )
        paths[p] = rel
    for p, digest in sha256_files(list(paths)).items():
        if digest != files[paths[p]].get("sha256"):
            raise VerificationError(
                f"--reference {reference}: {paths[p]} differs from the source of this artifact ({what})", hint=hint
            )
    return len(paths)


def check_report_target(path: Path, identity: Mapping[str, Any], *, explicit: bool, kind: str) -> None:
    """Refuse, before measuring, a report path that cannot be written, holds a file qwenquant did not
    write, an eval report of another kind, or one of another run (`identity`): the one rule of every
    command that writes a report (reportdoc.check_report_path)."""
    from qwenquant.evaluate.report import DOC, KINDS
    from qwenquant.reportdoc import check_report_path

    if (
        check_report_path(path, DOC, kind, kinds=KINDS, flag="--report", identity=identity, explicit=explicit)
        and Path(path).is_file()
    ):
        log.info("replacing %s (a report of the same run)", path)
