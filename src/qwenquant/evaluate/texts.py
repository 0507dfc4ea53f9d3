"""The evaluation windows: the committed reference's held-out windows, windows of a local text
file, or windows of a pinned Hub text set (evaluate/textset.py; `wikitext-2-test` is the default
for every model but the committed tiny reference, which keeps its shipped held-out text).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from qwenquant.errors import UsageError

if TYPE_CHECKING:
    import torch

    from qwenquant.evaluate.reportparts import TextSource


MIN_WINDOWS = 2  # a confidence interval needs two windows


def _check_size(available: int, windows: int, window_len: int, what: str, more: str = "pass a longer --text") -> None:
    """Enough windows of `window_len` tokens in the text; `more` says how to get more text where it holds
    fewer than any run accepts (--windows below 2 is itself refused)."""
    if windows < MIN_WINDOWS or window_len < 3:
        raise UsageError(
            f"--windows {windows} --window-len {window_len} is too small",
            hint="use at least 2 windows of 3 tokens (a confidence interval needs 2 windows)",
        )
    if available < windows:
        hint = (
            f"pass --windows {available} or less, or a shorter --window-len"
            if available >= MIN_WINDOWS
            else f"{more} (at least {MIN_WINDOWS} windows: {MIN_WINDOWS * window_len:,} tokens), or a shorter --window-len"
        )
        raise UsageError(
            f"{what} has {available} windows of {window_len} tokens, fewer than --windows {windows}", hint=hint
        )


def is_tiny_reference(folder: Path) -> bool:
    """Does `folder` hold the committed tiny reference's tokenizer (so its shipped windows apply)?"""
    from qwenquant.checkpoint import tinyref

    tok = Path(folder) / "tokenizer.json"
    return tok.is_file() and tok.read_bytes() == tinyref.verified_bytes("tokenizer.json")


def resolve_windows(
    reference: Path,
    windows: int,
    window_len: int,
    *,
    text: Path | None = None,
    text_set: str | None = None,
    cache: Path | None = None,
) -> tuple[torch.Tensor, TextSource]:
    """(windows [N, L], what they were cut from: the report's TextSource) for `--text FILE`, `--text-set NAME`, or the default:
    the shipped held-out text for the tiny reference, the pinned Hub text set for any other model;
    `--text-set depth` is the pinned depth text (evaluate/longwindow.py), for long windows."""
    from qwenquant.evaluate import longwindow, textset
    from qwenquant.evaluate.reportparts import TextSource

    if text is not None and text_set is not None:
        raise UsageError("give --text FILE or --text-set NAME, not both", hint="--text takes a local file")
    if text is not None:
        return eval_windows(reference, windows, window_len, text), TextSource(text=str(text))
    if text_set == longwindow.DEPTH_TEXT_SET:
        body, pinned = longwindow.depth_text()
        return _cut(reference, body, windows, window_len, text_set), pinned
    if text_set in (None, "auto") and is_tiny_reference(reference) or text_set == "tiny-reference":
        return eval_windows(reference, windows, window_len), TextSource(text="tiny-reference held-out")
    ts = textset.load_text_set(text_set if text_set not in (None, "auto") else textset.DEFAULT_TEXT_SET)
    body = textset.read_text(textset.fetch_text_set(ts, cache), ts)
    cut = _cut(reference, body, windows, window_len, ts.name, "pass --text FILE or another --text-set")
    return cut, ts.describe()


def _cut(
    reference: Path, body: str, windows: int, window_len: int, what: str, more: str = "pass a longer --text"
) -> torch.Tensor:
    """`body` tokenized with the reference's tokenizer, cut into consecutive windows."""
    import torch
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(reference) / "tokenizer.json"))
    ids = tok.encode(body, add_special_tokens=False).ids
    _check_size(len(ids) // window_len, windows, window_len, what, more)
    return torch.tensor(ids[: windows * window_len], dtype=torch.long).view(windows, window_len)


def eval_windows(reference: Path, windows: int, window_len: int, text: Path | None = None) -> torch.Tensor:
    """Token windows [windows, window_len] (int64) to evaluate on.

    Without `text`, the reference must be the committed tiny reference (same tokenizer bytes): its
    shipped held-out windows are used. With `text`, the file is tokenized with the reference's
    tokenizer and cut into consecutive windows.
    """
    from qwenquant.checkpoint import tinyref

    if text is None:
        if not is_tiny_reference(reference):
            raise UsageError(
                f"{reference} is not the committed tiny reference, and no --text was given",
                hint="pass --text FILE (plain text in the model's domain) to evaluate other models",
            )
        held = tinyref.heldout_ids()
        if window_len > held.shape[1]:
            raise UsageError(
                f"--window-len {window_len} is longer than the shipped windows ({held.shape[1]})",
                hint=f"use --window-len {held.shape[1]} or less, or cut longer windows from "
                "--text-set depth (the pinned depth text) or --text FILE",
            )
        _check_size(held.shape[0], windows, window_len, "the shipped held-out text", "pass --text FILE")
        return held[:windows, :window_len].clone()
    try:
        body = Path(text).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"--text {text}: file not found", hint="pass a plain UTF-8 text file") from None
    except UnicodeDecodeError as e:
        raise UsageError(
            f"--text {text} is not UTF-8 text ({e.reason} at byte {e.start})", hint="pass a plain UTF-8 text file"
        ) from None
    except OSError as e:
        raise UsageError(
            f"--text {text} cannot be read ({e.strerror or e})", hint="pass a plain UTF-8 text file"
        ) from None
    return _cut(reference, body, windows, window_len, f"--text {text}")


def window_text(reference: Path, ids: torch.Tensor) -> str | None:
    """`ids` decoded with the reference's tokenizer (None when it has no tokenizer.json)."""
    from tokenizers import Tokenizer

    path = Path(reference) / "tokenizer.json"
    if not path.is_file():
        return None
    return Tokenizer.from_file(str(path)).decode([int(i) for i in ids], skip_special_tokens=False)
