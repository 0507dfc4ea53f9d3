"""Source stage: what is being quantized, verified against its fetch record (or hashed as local)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qwenquant.atomic import atomic_write_json
from qwenquant.errors import StageError, VerificationError
from qwenquant.hashing import sha256_file, sha256_json
from qwenquant.quantize.stage import Stage, StageContext

if TYPE_CHECKING:
    from qwenquant.recipe import ModelSpec

log = logging.getLogger(__name__)

RECORD_NAME = "qwenquant-fetch.json"


def _files(source_dir: Path) -> list[Path]:
    return sorted(
        p
        for p in Path(source_dir).rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(source_dir).parts)
    )


def stat_fingerprint(source_dir: Path) -> str:
    """sha256 over (path, size, mtime_ns) of every file: cheap, changes when any file is touched."""
    rows = [(p.relative_to(source_dir).as_posix(), p.stat().st_size, p.stat().st_mtime_ns) for p in _files(source_dir)]
    return sha256_json(rows)


def check_model_config(source_dir: Path, model: ModelSpec, recipe_name: str) -> dict[str, Any]:
    """The source config.json, checked against the recipe's architectures/model types."""
    path = Path(source_dir) / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except FileNotFoundError:
        raise StageError(
            f"{path} not found: {source_dir} is not a model checkpoint", hint="pass the folder `qwenquant fetch` wrote"
        ) from None
    except ValueError as e:
        raise StageError(f"{path} is not valid JSON ({e})", hint="re-fetch the model") from None
    if not isinstance(cfg, dict):
        raise StageError(f"{path} is not a JSON object", hint="re-fetch the model")
    archs = cfg.get("architectures") or []
    if cfg.get("model_type") not in model.model_types or not set(archs) & set(model.architectures):
        raise StageError(
            f"{source_dir}: model_type {cfg.get('model_type')!r} / architectures {archs} are not what recipe "
            f"{recipe_name!r} is for ({model.model_types} / {model.architectures})",
            hint="pick a recipe for this model, or check the source folder",
        )
    _check_sizes(path, cfg)
    return cfg


# sizes of the text config every stage reads (text model, MTP head, memory plan)
TEXT_SIZES = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "vocab_size",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_conv_kernel_dim",
)


def _check_sizes(path: Path, cfg: dict[str, Any]) -> None:
    """Every size the stages read is a positive integer (StageError naming the key otherwise)."""
    tc = cfg.get("text_config")
    if not isinstance(tc, dict):
        tc = cfg
    where = "text_config." if tc is not cfg else ""
    for key in TEXT_SIZES:
        value = tc.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            what = "is missing" if value is None else f"is {value!r}, not a positive integer"
            raise StageError(
                f"{path}: {where}{key} {what}",
                hint="the config.json of a Qwen3.5-architecture checkpoint has it; re-fetch or fix the file",
            )


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


def validate_source(source_dir: Path, model: ModelSpec, recipe_name: str) -> None:
    """Check a source folder the way `qwenquant fetch` checks a download, reading headers only.

    config.json parses and names a supported architecture, every safetensors header parses and its
    data area matches the file size, every shard the index names exists and holds what it says, a
    tokenizer is present. Raises StageError naming the first file at fault.
    """
    from qwenquant.errors import FetchError
    from qwenquant.fetch.snapshot import check_shards, validate_file

    source_dir = Path(source_dir)
    if not source_dir.is_dir():
        what = (
            f"source {source_dir} is not a folder" if source_dir.exists() else f"source folder not found: {source_dir}"
        )
        raise StageError(what, hint="check the path, or run `qwenquant fetch`")
    check_model_config(source_dir, model, recipe_name)
    names = {p.relative_to(source_dir).as_posix() for p in _files(source_dir)}
    try:
        for name in sorted(names):
            if name.endswith((".safetensors", ".json")):
                validate_file(source_dir / name, name, check_model=True)
        check_shards(source_dir, names)
    except FetchError as e:
        raise StageError(
            f"source {source_dir}: {e.message}",
            hint="the source checkpoint is damaged or incomplete; copy or fetch it again",
        ) from None
    if not any(n.endswith(".safetensors") for n in names):
        raise StageError(
            f"source {source_dir} holds no *.safetensors weights",
            hint="copy the model's safetensors shards there, or fetch it with `qwenquant fetch`",
        )
    if not any(n in names for n in TOKENIZER_FILES):
        raise StageError(
            f"source {source_dir} has no tokenizer ({' / '.join(TOKENIZER_FILES)})",
            hint="copy the model's tokenizer files there, or fetch it with `qwenquant fetch`",
        )


def describe_source(
    source_dir: Path,
    model: ModelSpec,
    recipe_name: str,
    *,
    unverified: bool,
    progress: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Verify (fetch record) or hash (--source-unverified) the source; return its description."""
    from qwenquant.hashing import sha256_files

    source_dir = Path(source_dir)
    if not source_dir.is_dir():
        validate_source(source_dir, model, recipe_name)  # names what is wrong with the path
    check_model_config(source_dir, model, recipe_name)
    if not unverified:
        from qwenquant.fetch import verify_fetch_record

        try:
            record = verify_fetch_record(source_dir, progress)
        except VerificationError as e:
            raise VerificationError(
                e.message, hint=(e.hint or "") + " (or pass --source-unverified to quantize a local folder as is)"
            ) from None
        validate_source(source_dir, model, recipe_name)  # after the hashes: a drifted file is reported as drift
        files = {f["path"]: {"size": f["size"], "sha256": f["sha256"]} for f in record["files"]}
        return {
            "kind": "fetched",
            "verified": True,
            "repo": record.get("repo_id"),
            "repo_type": record.get("repo_type", "model"),
            "revision": record.get("revision"),
            "commit": record.get("commit"),
            "files": files,
        }
    validate_source(source_dir, model, recipe_name)
    paths = [p for p in _files(source_dir) if p.name != RECORD_NAME]
    digests = sha256_files(paths, progress=progress)
    files = {p.relative_to(source_dir).as_posix(): {"size": p.stat().st_size, "sha256": digests[p]} for p in paths}
    log.warning("source %s is not verified against a fetch record (--source-unverified)", source_dir)
    return {
        "kind": "local-unverified",
        "verified": False,
        "repo": None,
        "revision": None,
        "commit": None,
        "files": files,
    }


def _inputs(ctx: StageContext) -> dict[str, str]:
    record = ctx.source / RECORD_NAME
    return {"stat": stat_fingerprint(ctx.source), "fetch_record": sha256_file(record) if record.is_file() else "none"}


def _run(ctx: StageContext, out_dir: Path) -> dict[str, Any]:
    desc = describe_source(ctx.source, ctx.recipe.model, ctx.recipe.name, unverified=ctx.source_unverified)
    atomic_write_json(out_dir / "source.json", desc)
    return {k: v for k, v in desc.items() if k != "files"} | {"file_count": len(desc["files"])}


def _same_outputs(ctx: StageContext, record: dict[str, Any]) -> str | None:
    """Why a run writes the source.json of `record` (for `--plan`), or None: only the folder's path
    changed and its files are the same by name, size and mtime, or (verified source) the fetch record
    is the same one, which source.json is made from (the run fails if the files do not match it)."""
    if record["params"].get("unverified") != ctx.source_unverified:
        return None
    now = _inputs(ctx)
    if (
        not ctx.source_unverified
        and now["fetch_record"] != "none"
        and record["inputs"].get("fetch_record") == now["fetch_record"]
    ):
        return "the same fetch record"
    if record["inputs"].get("stat") == now["stat"]:
        return "the same files by name, size and mtime"
    return None


def _plan_note(ctx: StageContext) -> str:
    """What running the stage costs: every source file is read once (stat only here)."""
    files = [p for p in _files(ctx.source) if p.name != RECORD_NAME]
    size = sum(p.stat().st_size for p in files)
    check = "" if ctx.source_unverified else " against the fetch record"
    return (
        f"hashes {len(files)} source files ({size / 1e9:.1f} GB){check}"
        if size >= 1e8
        else f"hashes {len(files)} source files ({size:,} bytes){check}"
    )


STAGE = Stage(
    "source",
    _inputs,
    lambda ctx: {"unverified": ctx.source_unverified, "path": str(ctx.source)},
    _run,
    manifest=lambda o: {"source": json.loads((o.dir / "source.json").read_text())},
    preflight=lambda source, recipe: validate_source(source, recipe.model, recipe.name),
    plan_note=_plan_note,
    same_outputs=_same_outputs,
)
