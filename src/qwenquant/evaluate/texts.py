"""The evaluation windows: the committed reference's held-out windows, or windows of a local text file.

A pinned Hub text set (fetched and verified like calibration) is the default meant for real
models; until it is wired, real models take `--text FILE`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from qwenquant.errors import UsageError

if TYPE_CHECKING:
    import torch


def _check_size(available: int, windows: int, window_len: int, what: str) -> None:
    if windows < 2 or window_len < 3:
        raise UsageError(f"--windows {windows} --window-len {window_len} is too small",
                             hint="use at least 2 windows of 3 tokens (a confidence interval needs 2 windows)")
    if available < windows:
        raise UsageError(f"{what} has {available} windows of {window_len} tokens, fewer than --windows {windows}",
                             hint=f"pass --windows {available} or less, or a shorter --window-len")


def eval_windows(reference: Path, windows: int, window_len: int, text: Path | None = None) -> torch.Tensor:
    """Token windows [windows, window_len] (int64) to evaluate on.

    Without `text`, the reference must be the committed tiny reference (same tokenizer bytes): its
    shipped held-out windows are used. With `text`, the file is tokenized with the reference's
    tokenizer and cut into consecutive windows.
    """
    import torch

    from qwenquant.tiny import reference_model

    if text is None:
        tok = Path(reference) / "tokenizer.json"
        if not tok.is_file() or tok.read_bytes() != reference_model.verified_bytes("tokenizer.json"):
            raise UsageError(
                f"{reference} is not the committed tiny reference, and no --text was given",
                hint="pass --text FILE (plain text in the model's domain) to evaluate other models")
        held = reference_model.heldout_ids()
        if window_len > held.shape[1]:
            raise UsageError(f"--window-len {window_len} is longer than the shipped windows ({held.shape[1]})",
                                 hint=f"use --window-len {held.shape[1]} or less")
        _check_size(held.shape[0], windows, window_len, "the shipped held-out text")
        return held[:windows, :window_len].clone()
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(reference) / "tokenizer.json"))
    ids = tok.encode(Path(text).read_text(encoding="utf-8"), add_special_tokens=False).ids
    _check_size(len(ids) // window_len, windows, window_len, str(text))
    return torch.tensor(ids[: windows * window_len], dtype=torch.long).view(windows, window_len)
