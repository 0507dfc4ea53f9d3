"""Calibration stage: text -> token ids, saved with a fingerprint later stages and the manifest use.

Local sets (jsonl/parquet) and pinned Hub datasets are both read with `datasets` from local files;
tokenized with the source checkpoint's tokenizer (chat template for `messages` lists when the spec
says so), truncated to `max_length`, `num_samples` taken after a seeded shuffle. The fingerprint is
the sha256 of every token id as int32 little-endian, samples concatenated in order.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qwenquant.atomic import atomic_write_json
from qwenquant.errors import StageError
from qwenquant.hashing import DigestCache, sha256_json
from qwenquant.quantize.stage import Stage, StageContext

if TYPE_CHECKING:
    from qwenquant.recipe import CalibrationSpec

log = logging.getLogger(__name__)

TOKENS_FILE = "tokens.safetensors"
INFO_FILE = "calibration.json"


@dataclass(frozen=True)
class CalibrationTokens:
    """The calibration set as token id lists, plus the ids of the rows they came from."""

    samples: list[list[int]]
    sample_ids: list[int]

    @property
    def token_total(self) -> int:
        return sum(len(s) for s in self.samples)

    def fingerprint(self) -> str:
        return token_fingerprint(self.samples)


def token_fingerprint(samples: list[list[int]]) -> str:
    """sha256 over the int32 little-endian concatenation of every sample's token ids."""
    import numpy as np

    h = hashlib.sha256()
    for s in samples:
        h.update(np.asarray(s, dtype="<i4").tobytes())
    return h.hexdigest()


def data_files(spec: CalibrationSpec, fetched_dir: Path | None = None) -> list[Path]:
    """The local files a calibration spec reads (the local path, or the fetched dataset's files)."""
    if spec.source == "local":
        p = spec.resolved_path()
        if p is None or not p.is_file():
            raise StageError(
                f"calibration file not found: {p}",
                hint="check the `path:` of the calibration definition (relative to its YAML)",
            )
        return [p]
    if fetched_dir is None:
        raise StageError("hub calibration data was not fetched")
    files = sorted(
        p
        for p in Path(fetched_dir).rglob("*")
        if p.is_file()
        and p.suffix in (".parquet", ".jsonl", ".json")
        and _split_matches(p.relative_to(fetched_dir).as_posix(), spec.split)
    )
    if not files:
        raise StageError(
            f"no data files for split {spec.split!r} in dataset {spec.dataset}@{spec.revision}",
            hint="check `calibration.split` against the dataset's file names",
        )
    return files


def _split_matches(rel: str, split: str) -> bool:
    name = rel.rsplit("/", 1)[-1]
    return (
        name.startswith(split + "-")
        or name.startswith(split + ".")
        or f"/{split}/" in f"/{rel}"
        or rel.startswith(split + "/")
    )


def fetch_hub_dataset(spec: CalibrationSpec, base: Path) -> Path:
    """Fetch the pinned dataset revision through the project's fetch code (sha256-verified), into
    `base`/DATASET@REVISION; that folder."""
    from qwenquant.fetch import fetch_snapshot

    dataset, revision = spec.dataset, spec.revision
    if not dataset or not revision:  # a recipe file is checked for both; a spec built in code is not
        raise StageError(
            f"calibration: a hub dataset needs `dataset` and a pinned `revision` (got {dataset!r}, {revision!r})",
            hint="name the dataset and its 40-hex commit in the recipe's calibration block",
        )
    dest = base / f"{dataset.replace('/', '--')}@{revision}"
    fetch_snapshot(dataset, dest, revision=revision, repo_type="dataset")
    return dest


def load_rows(files: list[Path], cache_dir: Path) -> Any:
    """Read jsonl/parquet files into one `datasets.Dataset` (no network, cache in `cache_dir`)."""
    import datasets

    kind = "parquet" if files[0].suffix == ".parquet" else "json"
    try:
        return datasets.load_dataset(kind, data_files=[str(f) for f in files], split="train", cache_dir=str(cache_dir))
    except (ValueError, OSError) as e:  # datasets raises these for unreadable/malformed files
        raise StageError(
            f"could not read calibration data {files[0].name}: {e}",
            hint="each jsonl line must be an object with the `text_field` of the spec",
        ) from e


def tokenize_rows(rows: Any, tokenizer: Any, spec: CalibrationSpec) -> CalibrationTokens:
    """Shuffle with the seed, tokenize, truncate; take the first `num_samples` non-empty rows."""
    field = spec.text_field
    if field not in rows.column_names:
        raise StageError(
            f"calibration data has no column {field!r} (columns: {', '.join(rows.column_names)})",
            hint="set `text_field` of the calibration spec to the column holding the text",
        )
    order = list(range(len(rows)))
    if spec.shuffle_seed is not None:
        import random

        random.Random(spec.shuffle_seed).shuffle(order)
    samples: list[list[int]] = []
    ids: list[int] = []
    for i in order:
        if len(samples) >= spec.num_samples:
            break
        value = rows[i][field]
        if isinstance(value, list):
            if spec.chat_template:
                text = tokenizer.apply_chat_template(value, tokenize=False, add_generation_prompt=False)
            else:
                text = "\n".join(str(m.get("content", "")) for m in value)
        else:
            text = str(value)
        tok = tokenizer(text, add_special_tokens=False, truncation=True, max_length=spec.max_length)["input_ids"]
        if tok:
            samples.append([int(t) for t in tok])
            ids.append(i)
    if not samples:
        raise StageError("calibration data produced no tokens", hint="check the calibration file is not empty")
    if len(samples) < spec.num_samples:
        log.warning("calibration: only %d samples available, %d requested", len(samples), spec.num_samples)
    return CalibrationTokens(samples, ids)


def save_tokens(out_dir: Path, calib: CalibrationTokens) -> None:
    """tokens.safetensors: `input_ids` (int32, concatenated) and `offsets` (int64, n+1)."""
    import torch
    from safetensors.torch import save

    from qwenquant.atomic import atomic_write_bytes

    flat = torch.tensor([t for s in calib.samples for t in s], dtype=torch.int32)
    offsets = [0]
    for s in calib.samples:
        offsets.append(offsets[-1] + len(s))
    atomic_write_bytes(
        out_dir / TOKENS_FILE,
        save({"input_ids": flat, "offsets": torch.tensor(offsets, dtype=torch.int64)}, metadata={"format": "pt"}),
    )


def load_tokens(stage_dir: Path) -> list[list[int]]:
    """The token id lists saved by `save_tokens`."""
    from safetensors.torch import load_file

    t = load_file(str(Path(stage_dir) / TOKENS_FILE))
    flat, off = t["input_ids"].tolist(), t["offsets"].tolist()
    return [flat[off[i] : off[i + 1]] for i in range(len(off) - 1)]


def run_calibration(
    spec: CalibrationSpec,
    source_dir: Path,
    out_dir: Path,
    *,
    datasets_dir: Path | None = None,
    digests: DigestCache | None = None,
) -> dict[str, Any]:
    """Build the calibration set into `out_dir`; return its description (also written as JSON).

    Hub datasets are fetched (pinned, verified) into `datasets_dir`, kept across runs. `digests`:
    the run's cache (a local data file's digest was taken for the stage inputs)."""
    from transformers import AutoTokenizer

    scratch = Path(tempfile.mkdtemp(prefix=".calib-", dir=out_dir))
    try:
        fetched = None
        if spec.source == "hub":
            base = Path(datasets_dir) if datasets_dir else scratch
            fetched = fetch_hub_dataset(spec, base)
        files = data_files(spec, fetched)
        rows = load_rows(files, scratch / "cache")
        tokenizer = AutoTokenizer.from_pretrained(str(source_dir))
        calib = tokenize_rows(rows, tokenizer, spec)
        cache = DigestCache.of(digests)
        described_files = {(f.relative_to(fetched).as_posix() if fetched else f.name): cache.file(f) for f in files}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    save_tokens(out_dir, calib)
    fingerprint = calib.fingerprint()
    info: dict[str, Any] = {
        "source": spec.source,
        "dataset": spec.dataset if spec.source == "hub" else None,
        "revision": spec.revision if spec.source == "hub" else None,
        "split": spec.split,
        "files": described_files,
        "num_samples": len(calib.samples),
        "sample_ids": calib.sample_ids,
        "token_total": calib.token_total,
        "max_length": spec.max_length,
        "chat_template": spec.chat_template,
        "shuffle_seed": spec.shuffle_seed,
        "fingerprint_sha256": fingerprint,
    }
    atomic_write_json(out_dir / INFO_FILE, info)
    log.info(
        "calibration: %d samples, %d tokens, fingerprint %s",
        len(calib.samples),
        calib.token_total,
        fingerprint[:16],
    )
    return info


def spec_identity(spec: CalibrationSpec) -> dict[str, Any]:
    """What the stage's record keeps of a spec: every field but a local file's `path`, whose bytes are
    an input of their own (their sha256). The shipped name, the recipe's `../calibration/...` and a
    copy's absolute path then name one set, and alternating them re-runs nothing."""
    fields = spec.model_dump(mode="json")
    return fields | {"path": None} if spec.source == "local" else fields


def _inputs(ctx: StageContext) -> dict[str, str]:
    spec = ctx.calibration
    data = spec.resolved_path() if spec.source == "local" else None
    return {
        "source": ctx.digest("source"),
        "spec": sha256_json(spec_identity(spec)),
        "data": ctx.digests.file(data)
        if data is not None and data.is_file()
        else f"hub:{spec.dataset}@{spec.revision}",
    }


def _same_outputs(ctx: StageContext, record: dict[str, Any]) -> str | None:
    """Why a run writes the tokens of `record` (for `--plan`), or None: the same source, the same data
    bytes and the same settings, whatever path named the file (a record made before the path left the
    stage's identity keeps it in its params)."""
    now, then = _inputs(ctx), record["inputs"]
    spec = record["params"].get("spec")
    if not isinstance(spec, dict) or (then.get("source"), then.get("data")) != (now["source"], now["data"]):
        return None
    kept = spec | {"path": None} if spec.get("source") == "local" else spec
    if kept != spec_identity(ctx.calibration):
        return None
    return "the same data and settings: tokenizing them gives the same tokens"


def _run(ctx: StageContext, out_dir: Path) -> dict[str, Any]:
    return run_calibration(
        ctx.calibration, ctx.source, out_dir, datasets_dir=ctx.work / "datasets", digests=ctx.digests
    )


STAGE = Stage(
    "calibration",
    _inputs,
    lambda ctx: {"spec": spec_identity(ctx.calibration)},
    _run,
    manifest=lambda o: {"calibration": dict(o.result)},
    same_outputs=_same_outputs,
)
