"""Disk space and writability of quantize's folders, checked before the first stage runs (as `fetch`
checks free space before it downloads), and the one-line error for a disk that fills up anyway.

What the stages write is estimated from the artifact's size (the memory plan's quantized weights
from config.json and the recipe, plus the source tensors the plan does not cover, such as the vision
tower): per stage, the share measured on the tiny model's run (work folder / artifact bytes).
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from qwenquant.atomic import writable_folder
from qwenquant.errors import StageError

if TYPE_CHECKING:
    from qwenquant.recipe import Recipe

# bytes a stage writes into the work folder, as a multiple of the artifact's weight bytes
STAGE_SHARE = {"gptq": 1.3, "lm_head": 0.55, "mtp": 0.3, "textonly": 0.7}
DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM)


def existing_ancestor(path: Path) -> Path:
    """`path` or its nearest parent that exists (where a new folder would be created)."""
    path = Path(path)
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_writable(out: Path, work: Path) -> None:
    """--out and --work can be created and written (a read-only mount, a folder of another user)."""
    for folder, flag in ((out, "--out"), (work, "--work")):
        here = existing_ancestor(folder)
        if not here.is_dir():
            raise StageError(f"{flag} {folder}: {here} is a file, not a folder", hint=f"choose another {flag}")
        writable_folder(here, f"{flag} {folder}", flag)


def artifact_bytes(source: Path, recipe: Recipe) -> int | None:
    """Estimated weight bytes of the finished artifact (None when the config cannot tell)."""
    from qwenquant.checkpoint.config import read_config
    from qwenquant.checkpoint.tensorfile import checkpoint_refs
    from qwenquant.errors import QwenquantError
    from qwenquant.plan.weights import QuantSettings, model_shape, weights_from_config

    try:
        shape = model_shape(read_config(source))
        planned = weights_from_config(shape, QuantSettings.from_recipe(recipe.canonical()))
        rest = sum(r.nbytes for n, r in checkpoint_refs(source).items() if "visual" in n)  # kept bf16
    except (QwenquantError, OSError, KeyError, ValueError, TypeError):
        return None
    return sum(planned.bytes.values()) + rest


def check_free_space(source: Path, out: Path, work: Path, recipe: Recipe, stages_left: list[str]) -> None:
    """StageError (exit 5) when the work folder's disk has less free space than the stages left
    will write, saying how much they need."""
    size = artifact_bytes(source, recipe)
    if size is None:
        return
    need = int(size * sum(STAGE_SHARE.get(s, 0.0) for s in stages_left))
    if not need:
        return
    here = existing_ancestor(work)
    free = shutil.disk_usage(here).free
    if need > free:
        raise StageError(
            f"--work {work}: the stages left ({', '.join(s for s in stages_left if s in STAGE_SHARE)}) "
            f"write about {_size(need)}, but only {_size(free)} is free on {here}",
            hint="free some space, or pass --work on a disk with room (a re-run resumes from the last complete stage)",
        )


def _size(n: int) -> str:
    """GiB with one decimal, MiB below 1 GiB (a small disk never reads "0.0 GiB")."""
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def disk_error(e: OSError, stage: str) -> StageError | None:
    """The one-line StageError for a full or read-only disk hit while `stage` writes (else None)."""
    if e.errno not in DISK_ERRNOS:
        return None
    where = f" ({e.filename})" if e.filename else ""
    return StageError(
        f"stage {stage}: {e.strerror or e}{where}",
        hint="free some space or fix the folder's permissions; a re-run resumes from this stage",
    )
