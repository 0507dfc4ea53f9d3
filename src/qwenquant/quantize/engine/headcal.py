"""The lm_head's calibration, produced by the streamed pass and read by the lm_head stage.

After the last decoder layer the streamed engine (`calibrate`) applies the final norm and folds the calibration
samples' final hidden states into the head's Hessian (`quantize.head_gptq.accumulate_hessian`, the same
function the lm_head stage uses on the whole model after the oneshot engine), and keeps the held-out samples' final
hidden states for the quality report. Both go to `head-calibration/` inside the gptq stage folder:
covered by its completion record, never carried into the artifact (only top-level files are).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from qwenquant.errors import StageError

if TYPE_CHECKING:
    from qwenquant.modeling.text import TextModelSource

FOLDER = "head-calibration"
HESSIAN = "hessian.safetensors"
HELDOUT = "heldout.safetensors"


@dataclass
class HeadCalibration:
    hessian: torch.Tensor | None  # [D, D] fp32, 2/N X^T X over calibration tokens
    tokens: int
    heldout: torch.Tensor | None  # [tokens, D] final hidden states of the held-out samples
    heldout_samples: int


def save(stage_dir: Path, cal: HeadCalibration) -> None:
    """Write the head calibration into `stage_dir/head-calibration/` (deterministic bytes)."""
    from qwenquant.checkpoint.assemble import torch_raw
    from qwenquant.checkpoint.tensorfile import write_shard

    d = Path(stage_dir) / FOLDER
    d.mkdir(parents=True, exist_ok=True)
    if cal.hessian is None:
        raise StageError("no calibration tokens reached lm_head", hint="check the calibration set")
    write_shard(
        d / HESSIAN,
        [
            torch_raw("hessian", cal.hessian.float().cpu()),
            torch_raw("tokens", torch.tensor([cal.tokens], dtype=torch.int64)),
        ],
    )
    held = cal.heldout if cal.heldout is not None else torch.zeros((0, cal.hessian.shape[0]), dtype=torch.bfloat16)
    write_shard(
        d / HELDOUT,
        [torch_raw("hidden", held.cpu()), torch_raw("samples", torch.tensor([cal.heldout_samples], dtype=torch.int64))],
    )


def load(stage_dir: Path) -> HeadCalibration | None:
    """The head calibration a streamed gptq stage left, or None (the oneshot engine leaves none)."""
    from qwenquant.checkpoint.tensorfile import shard_refs
    from qwenquant.modeling.text import ref_tensor

    d = Path(stage_dir) / FOLDER
    if not (d / HESSIAN).is_file():
        return None
    h, held = shard_refs(d / HESSIAN), shard_refs(d / HELDOUT)
    hidden = ref_tensor(held["hidden"]).float()  # the stage folds fp32, as it did from the model
    n_held = int(ref_tensor(held["samples"])[0])
    return HeadCalibration(
        ref_tensor(h["hessian"]), int(ref_tensor(h["tokens"])[0]), hidden if hidden.shape[0] else None, n_held
    )


def calibrate(
    src: TextModelSource,
    acts: list[torch.Tensor],
    order: list[int],
    heldout: list[int],
    device: str,
    ranks: Any,
    precision: str = "tensor-core",
    mtp: tuple[Any, list[list[int]]] | None = None,
) -> HeadCalibration | None:
    """Final norm over this process's samples, then the lm_head Hessian (in the recipe's Hessian
    precision) and held-out hidden states (summed / gathered onto rank 0 in an N-process job). `mtp`:
    (engine.mtpcal.MtpCalibration, the samples' tokens): every calibration sample's final hidden
    states also go through the MTP head."""
    from qwenquant.modeling.text import final_norm
    from qwenquant.quantize import head_gptq as lh

    norm = final_norm(src, device)
    H, tokens, held = None, 0, {}
    held_set = set(heldout)
    where = {k: pos for pos, k in enumerate(order)}
    with torch.no_grad():
        for j in sorted(where):  # sample order, as the lm_head stage folded them from the model
            h = norm(acts[where[j]])
            if j in held_set:
                held[j] = h.reshape(-1, h.shape[-1]).cpu()
            else:
                H, tokens = lh.accumulate_hessian(H, h, tokens, precision=precision)
                if mtp is not None:
                    mtp[0].add(mtp[1][j], h)
            acts[where[j]] = None  # type: ignore[call-overload]  # free as we go: nothing reads it again
    if ranks is not None:
        from qwenquant.quantize.engine import dist

        combined = dist.combine_head(H, tokens, held, int(src.config.hidden_size), device, ranks)
        if combined is None:
            return None
        H, tokens, held_list = combined
    else:
        held_list = [held[j] for j in sorted(held)]
    return HeadCalibration(H, tokens, torch.cat(held_list) if held_list else None, len(held_list))
