"""A checkpoint folder's config.json and safetensors index, read one way everywhere."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from qwenquant.checkpoint.header import INDEX_NAME
from qwenquant.errors import UsageError

CONFIG_NAME = "config.json"


def read_config(folder: Path) -> dict[str, Any]:
    """config.json of a checkpoint or artifact folder, or a UsageError naming the file."""
    path = Path(folder) / CONFIG_NAME
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"{folder} has no {CONFIG_NAME}", hint="pass a checkpoint or artifact folder") from None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise UsageError(f"{path} is not readable JSON ({e})".splitlines()[0],
                         hint="re-fetch or rebuild the folder") from None
    if not isinstance(config, dict):
        raise UsageError(f"{path} is not a JSON object", hint="re-fetch or rebuild the folder")
    return config


def text_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The text model's config: `text_config` of a multimodal config, else the config itself."""
    tc = config.get("text_config")
    return dict(tc if isinstance(tc, Mapping) else config)


def read_weight_map(folder: Path) -> dict[str, str] | None:
    """tensor name -> shard file, from the folder's index; None when the folder has no index."""
    path = Path(folder) / INDEX_NAME
    if not path.is_file():
        return None
    return dict(json.loads(path.read_text())["weight_map"])
