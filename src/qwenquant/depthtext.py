"""The pinned depth text (data/depthtext/): the long stdlib text bench depth, soak and turns cut prompts from and
`eval offline --text-set depth` cuts windows from. Read as shipped and refused when its bytes are not the ones
depthtext.yaml pins; each caller names the error its command exits with."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from qwenquant.errors import QwenquantError


@dataclass(frozen=True)
class PinnedText:
    text: str
    sha256: str
    license: str
    source: str
    file: str  # the file name under data/depthtext/


def read_pinned(error: type[QwenquantError], hint: str) -> PinnedText:
    """The shipped text; `error(message, hint=hint)` when its sha256 is not the pinned one."""
    import yaml

    from qwenquant import data_path

    meta_path = data_path("depthtext", "depthtext.yaml")
    meta = yaml.safe_load(meta_path.read_text())
    path = data_path("depthtext", meta["file"])
    raw = path.read_bytes()
    got = hashlib.sha256(raw).hexdigest()
    if got != meta["sha256"]:
        raise error(f"{path} has sha256 {got}, not the {meta['sha256']} {meta_path.name} pins", hint=hint)
    return PinnedText(raw.decode("utf-8"), got, str(meta["license"]), str(meta["source"]), str(meta["file"]))
