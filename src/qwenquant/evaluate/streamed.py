"""A layer-streamed forward for eval: both arms one decoder layer at a time, read from the shards.

For models whose bf16 weights do not fit the device (the 27B on a 24 GB GPU), eval cannot hold
either arm whole. This runs the reference and the artifact through the same layer loop the
streamed GPTQ engine uses (engine/model.py: transformers' own Qwen3_5DecoderLayer built from one
layer's tensors, the same masks and position embeddings): for layer i, the reference's layer i
(source bytes, float32) runs every window, then the artifact's layer i (packed Linears
dequantized by compressed-tensors on the eval device, evaluate/weights.py), and both are dropped. Only the windows'
hidden states of both arms stay, on the host (N x L x H float32 each), plus the small MTP heads; one window at
a time goes to the device, and a layer's MLP runs a chunk of positions at a time (evaluate/longwindow.py:
what a 128K window needs). The result is
two `TextForward`s (forward.py) over the precomputed final hidden states, so evaluate_forwards
computes exactly the dense path's figures; the arithmetic is the dense path's (float32, sdpa),
windows one at a time instead of batched.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from qwenquant.evaluate.reportparts import Int8Linears

log = logging.getLogger(__name__)


class PrecomputedForward:
    """A `TextForward` over final hidden states computed ahead for a fixed set of windows (held on the host,
    moved to `device` one batch at a time); the MTP head's token embeddings are read from the shards as asked."""

    def __init__(
        self,
        windows: torch.Tensor,
        hidden: torch.Tensor,
        embed: Callable[[torch.Tensor], torch.Tensor],
        mtp: Any,
        device: str,
    ) -> None:
        self._row = {bytes(w.numpy().tobytes()): i for i, w in enumerate(windows)}
        self.hidden, self.embed, self.mtp, self.device = hidden, embed, mtp, device

    def _rows(self, ids: torch.Tensor) -> list[int]:
        return [self._row[bytes(w.numpy().tobytes())] for w in ids.cpu()]

    def final_hidden(self, ids: torch.Tensor) -> torch.Tensor:
        """Post-final-norm hidden states [B, L, H] of windows given ahead."""
        return self.hidden[self._rows(ids)].to(self.device)

    @torch.no_grad()
    def mtp_hidden(self, ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor | None:
        """MTP output [B, T-1, H] for any ids [B, T] and their hidden states (as DenseForward.mtp_hidden); None
        without an MTP head."""
        if self.mtp is None:
            return None
        return self.mtp(self.embed(ids[:, 1:]), hidden[:, :-1]).float()


class _Arm:
    """One side of the comparison: its tensors, config, and how its layer tensors become dense."""

    def __init__(self, folder: Path, device: str) -> None:
        from qwenquant.checkpoint.tensorfile import checkpoint_refs
        from qwenquant.evaluate.weights import read_config
        from qwenquant.modeling.text import open_source

        self.folder, self.device = Path(folder), device
        self.config = read_config(folder)
        self.refs = checkpoint_refs(folder)
        src = open_source(folder, self.refs)
        text = copy.deepcopy(src.config)
        text._attn_implementation = "sdpa"  # what DenseForward runs
        self.src = dataclasses.replace(src, config=text, dtype=torch.float32)

    def dense(self, names: list[str], device: str | None = None) -> dict[str, torch.Tensor]:
        """float32 tensors of `names` (full names) on the arm's device, packed modules dequantized to
        `<module>.weight` there (unpacking and scaling are exact, so the device does not change a value;
        on a GPU it keeps the host free of float32 copies and the CPU out of the loop)."""
        return self.dequantized(self.stored(names, device))

    def stored(self, names: list[str], device: str | None = None) -> dict[str, torch.Tensor]:
        """The tensors of `names` as stored (packed modules packed), on `device` (default the arm's)."""
        from qwenquant.modeling.text import ref_tensor

        return {n: ref_tensor(self.refs[n]).to(device or self.device) for n in names}

    def dequantized(self, raw: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """`raw` in float32, packed modules dequantized to `<module>.weight`."""
        from qwenquant.evaluate.weights import dequantize

        if not any(n.endswith(".weight_packed") for n in raw):
            return {n: t.float() for n, t in raw.items()}
        return dequantize(raw, self.config)

    def layer(self, i: int) -> torch.nn.Module:
        return self.build(i, self.dequantized(self.stored(self.src.layer_names(i))))

    def build(self, i: int, dense: dict[str, torch.Tensor]) -> torch.nn.Module:
        """Decoder layer `i` from its float32 tensors (full names)."""
        from qwenquant.evaluate.longwindow import chunk_positions
        from qwenquant.modeling.text import build_layer

        p = self.src.layer_prefix(i)
        layer = build_layer(self.src, i, {n[len(p) :]: t for n, t in dense.items()}, self.device)
        mlp: Any = layer.mlp  # nn.Module's __getattr__ types it Tensor | Module; it is the layer's MLP module
        mlp.forward = chunk_positions(mlp.forward)  # a long window's MLP, a chunk of positions at a time
        return layer

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """float32 token embeddings [B, T, H] of `ids`, reading only the rows they use."""
        from qwenquant.modeling.text import embed_samples

        return torch.cat(embed_samples(self.src, ids.tolist(), self.device)).float()

    def head(self) -> torch.Tensor:
        names = [n for n in self.refs if n.startswith("lm_head.")]
        # unpacked on the host: compressed-tensors' unpack of a 248k x 5k head holds int64 temporaries
        # (4.7 GiB) that do not fit a 24 GB GPU beside the other two heads
        return self.dense(names, device="cpu")["lm_head.weight"].to(self.device)

    def mtp(self) -> Any:
        return self.mtp_from(self.stored([n for n in self.refs if n.startswith("mtp.")]))

    def mtp_from(self, raw: dict[str, torch.Tensor]) -> Any:
        """The MTP head built from its stored tensors `raw` (None when there are none)."""
        from qwenquant.modeling.mtp import MTPHead

        if not raw:
            return None
        head = MTPHead(self.src.config).float().eval()
        head.load_state_dict({n[len("mtp.") :]: t for n, t in self.dequantized(raw).items()})
        return head.to(self.device)


class _Int8Arm(_Arm):
    """The artifact again, every packed Linear (body, MTP head, lm_head) run as vLLM's int8-activation Marlin
    path (evaluate/int8act.py), built layer by layer from the same shards, each layer's tensors read once.
    Overflow counts are summed as each layer is dropped (`flush`)."""

    def __init__(self, folder: Path, device: str) -> None:
        super().__init__(folder, device)
        self.overflows = 0
        self._live: list[Any] = []  # the int8-activation Linears in use (int8act.int8_modules)
        self.swapped: list[str] = []  # the Linears given int8 inputs (int8act.int8_counts)
        self.lm_head = False

    def _modules(self, raw: dict[str, torch.Tensor]) -> dict[str, Any]:
        """The int8-activation Linears of the packed modules in `raw` (stored names), under eval's names."""
        from qwenquant.evaluate.int8act import int8_modules
        from qwenquant.evaluate.weights import normalize_name

        named = {normalize_name(n): t for n, t in raw.items()}
        return int8_modules({k: v for k, v in named.items() if k is not None}, self.config)

    def _swap(self, root: torch.nn.Module, raw: dict[str, torch.Tensor], prefix: str) -> None:
        """Replace the packed Linears of `root` (named below `prefix`) by int8-activation ones built from `raw`."""
        from qwenquant.evaluate.int8act import swap_linears

        self.flush()
        mods = {k: m for k, m in self._modules(raw).items() if k.startswith(prefix)}
        self.swapped += swap_linears(root, mods, prefix=prefix)
        self._live = list(mods.values())

    def flush(self) -> int:
        """Add the overflows of the modules in use to `overflows` and let them go; the total."""
        self.overflows += sum(m.overflows for m in self._live)
        self._live = []
        return self.overflows

    def layer(self, i: int) -> torch.nn.Module:
        from qwenquant.evaluate.weights import normalize_name

        raw = self.stored(self.src.layer_names(i))
        layer = self.build(i, self.dequantized(raw))
        self._swap(layer, raw, str(normalize_name(self.src.layer_prefix(i))))
        return layer

    def mtp(self) -> Any:
        raw = self.stored([n for n in self.refs if n.startswith("mtp.")])
        head = self.mtp_from(raw)
        if head is not None:
            self._swap(head, raw, "mtp.")
            self.mtp_modules = self._live  # the MTP head runs after the layers: counted then
        return head

    def int8_head(self) -> Any:
        """The lm_head as an int8-activation Linear (hidden -> logits), or None when the head is not int4."""
        lm = self._modules(self.stored([n for n in self.refs if n.startswith("lm_head.")], "cpu")).get("lm_head")
        self.lm_head = lm is not None
        return lm.to(self.device) if lm is not None else None

    @property
    def counts(self) -> Int8Linears:
        from qwenquant.evaluate.int8act import int8_counts

        return int8_counts(self.swapped, self.lm_head)


def _run_layers(
    arms: Mapping[str, _Arm], embeds: Mapping[str, list[torch.Tensor]], device: str
) -> dict[str, list[torch.Tensor]]:
    """Every window through every decoder layer of each arm, one layer of one arm and one window on the device
    at a time; the windows' hidden states [1, L, H] wait on the host between layers."""
    from qwenquant.console import timed
    from qwenquant.modeling.text import LayerInputs, final_norm

    first = next(iter(arms.values()))
    inputs = LayerInputs(first.src, device)
    acts = {name: [x.cpu() for x in embeds[name]] for name in arms}
    for i in range(first.src.num_layers):
        layer_type = first.src.config.layer_types[i]
        with timed(log, f"eval: decoder layer {i + 1}/{first.src.num_layers}, both arms"):
            for name, arm in arms.items():
                layer = arm.layer(i)
                with torch.no_grad():
                    acts[name] = [_through(layer, x, inputs, layer_type, device) for x in acts[name]]
                del layer
    for name, arm in arms.items():
        norm = final_norm(arm.src, device)
        with torch.no_grad():
            acts[name] = [norm(x.to(device)).float().cpu() for x in acts[name]]
    return acts


def _through(layer: torch.nn.Module, x: torch.Tensor, inputs: Any, layer_type: str, device: str) -> torch.Tensor:
    """One window [1, L, H] through one decoder layer on `device`, back on the host."""
    x = x.to(device)
    return layer(x, **inputs.kwargs(x, layer_type)).cpu()


def streamed_forwards(
    reference: Path, artifact: Path, windows: torch.Tensor, *, device: str = "cpu", int8: bool = False
) -> tuple[
    PrecomputedForward, PrecomputedForward, dict[str, torch.Tensor], tuple[PrecomputedForward, Any, _Int8Arm] | None
]:
    """(reference forward, artifact forward, heads, int8 arm) for `windows` [N, L], as run_offline's dense
    path gives; with `int8`, the third arm through the same layer loop: (its forward, its lm_head as a
    function of the hidden states, the arm for its overflow count), else None."""
    from qwenquant.console import timed
    from qwenquant.evaluate.weights import rtn_head
    from qwenquant.modeling.text import embed_samples

    arms = {"reference": _Arm(reference, device), "artifact": _Arm(artifact, device)}
    if int8:
        arms["int8"] = _Int8Arm(artifact, device)
    samples = windows.tolist()
    with timed(log, f"eval: embeddings of {len(samples)} windows, both arms"):
        # on the host: the layer loop moves one window at a time to the device
        embeds = {name: embed_samples(arm.src, samples, "cpu") for name, arm in arms.items()}
    acts = _run_layers(arms, embeds, device)
    del embeds
    with timed(log, "eval: MTP heads, both arms"):
        out = {
            name: PrecomputedForward(windows, torch.cat(acts.pop(name)), arm.embed, arm.mtp(), device)
            for name, arm in arms.items()
        }
    with timed(log, f"eval: lm_heads (reference, round-to-nearest, artifact) on {device}"):
        ref_head = arms["reference"].head()  # each head built on the device, one after the other
        heads = {"reference": ref_head, "rtn": rtn_head(ref_head), "artifact": arms["artifact"].head()}
    extra = None
    if int8:
        arm = arms["int8"]
        assert isinstance(arm, _Int8Arm)
        arm.flush()
        lm = arm.int8_head()
        arm._live = [*getattr(arm, "mtp_modules", []), *([lm] if lm is not None else [])]  # counted by flush()
        extra = (out["int8"], lm if lm is not None else (lambda h: h @ heads["artifact"].T), arm)
    return out["reference"], out["artifact"], heads, extra
