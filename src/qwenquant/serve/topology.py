"""How a multi-GPU server splits the model: vLLM tensor or pipeline parallelism, chosen from the
link between the GPUs when the command line does not say.

Tensor parallelism all-reduces every layer's output between the GPUs, twice a layer and step;
pipeline parallelism sends one activation from each stage to the next. Between cards joined by
NVLink, or over PCIe with peer-to-peer transfers, tensor parallelism is the faster (it also
splits each step's work, so one stream runs faster); over PCIe without peer-to-peer, every
all-reduce goes through host memory, and pipeline parallelism is the usual advice (third-party
reports on two RTX 3090s: README, "Two GPUs").

MTP drafting under pipeline parallelism is unsupported upstream (RFC #44697, PR #44698 open; vLLM builds the
drafter on the last stage only, and a public two-3090 run saw draft acceptance fall from 45.6% to 8% at PP=2), so
the automatic layout of a profile that drafts is tensor, whatever the link, and says why.

The pure half parses `nvidia-smi topo -m` (the link matrix: X self, NV# a bonded set of #
NVLinks, PIX/PXB/PHB/NODE/SYS PCIe paths, shortest first) and `nvidia-smi topo -p2p r` (peer-to-peer
reads: OK, or CNS/GNS/TNS/NS/U for why not); `choose_split` decides from the link, `decide_layout` from the
command line first (serve, bench, eval and plan call it). `read_topology` runs nvidia-smi.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum


class Split(str, Enum):
    """How a model is split over several GPUs (--split): vLLM tensor or pipeline parallelism."""

    tensor = "tensor"
    pipeline = "pipeline"


TENSOR = Split.tensor.value
PIPELINE = Split.pipeline.value
SPLITS = (TENSOR, PIPELINE)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_DEVICE = re.compile(r"^(GPU\d+|NIC\d+)$")


@dataclass(frozen=True)
class Layout:
    """The parallel layout a server uses and why (printed before it starts)."""

    tp: int  # tensor-parallel size
    pp: int  # pipeline-parallel size
    reason: str

    @classmethod
    def of(cls, kind: str, gpus: int, reason: str) -> Layout:
        return cls(gpus, 1, reason) if kind == TENSOR else cls(1, gpus, reason)

    @property
    def gpus(self) -> int:
        return self.tp * self.pp

    @property
    def kind(self) -> str:
        return PIPELINE if self.pp > 1 else TENSOR

    def line(self) -> str:
        sizes = f"tensor {self.tp} x pipeline {self.pp}" if self.tp > 1 and self.pp > 1 else f"{self.kind} parallelism"
        return f"split over {self.gpus} GPUs: {sizes} ({self.reason})"


def parse_matrix(text: str) -> dict[tuple[str, str], str]:
    """{(GPU index, GPU index): entry} from an `nvidia-smi topo -m` or `topo -p2p r` matrix
    (the GPU rows and columns only; NIC rows and the affinity columns are left out)."""
    lines = [_ANSI.sub("", line).split() for line in text.splitlines()]
    start = next((i for i, toks in enumerate(lines) if "GPU0" in toks), None)
    if start is None:
        return {}
    cols: list[str] = []
    for tok in lines[start]:  # the header: the device columns, then CPU Affinity, NUMA Affinity, ...
        if not _DEVICE.match(tok):
            break
        cols.append(tok)
    out: dict[tuple[str, str], str] = {}
    for toks in lines[start + 1 :]:
        if not toks or not re.match(r"GPU\d+$", toks[0]):
            continue
        for col, entry in zip(cols, toks[1 : 1 + len(cols)], strict=False):
            if col.startswith("GPU"):
                out[toks[0][3:], col[3:]] = entry
    return out


def choose_split(gpus: Sequence[str], links: dict[tuple[str, str], str], p2p: dict[tuple[str, str], str]) -> Layout:
    """Tensor parallelism when every pair of `gpus` (nvidia-smi indices) is joined by NVLink or reads
    its peer over PCIe; pipeline when some pair has neither; tensor (the old default) with the
    reason when the link cannot be read."""
    n = len(gpus)
    pairs = [(a, b) for i, a in enumerate(gpus) for b in gpus[i + 1 :]]
    if not pairs:
        return Layout.of(TENSOR, n, "one GPU")
    if any((a, b) not in links for a, b in pairs):
        return Layout.of(
            TENSOR, n, "the GPUs' link could not be read from `nvidia-smi topo -m`; pass --split to choose"
        )
    kinds = sorted({links[p] for p in pairs})
    if all(k.startswith("NV") for k in kinds):
        return Layout.of(TENSOR, n, f"NVLink between every pair of GPUs ({', '.join(kinds)})")
    slow = [(a, b) for a, b in pairs if not links[a, b].startswith("NV")]
    no_p2p = [(a, b) for a, b in slow if p2p.get((a, b)) != "OK"]
    if not no_p2p:
        return Layout.of(TENSOR, n, f"PCIe ({', '.join(kinds)}) with peer-to-peer reads between the GPUs")
    a, b = no_p2p[0]
    why = p2p.get((a, b))
    read = f"peer-to-peer read {why}" if why else "peer-to-peer unknown"
    return Layout.of(
        PIPELINE,
        n,
        f"GPU {a} and GPU {b} are linked by PCIe ({links[a, b]}) without peer-to-peer "
        f"({read}): tensor parallelism's all-reduce would cross host memory every layer",
    )


MTP_TENSOR = "the profile drafts with MTP, which vLLM does not support under pipeline parallelism (RFC #44697)"


def decide_layout(
    gpus: int,
    split: str | None,
    device: str,
    extra_tp: int | None,
    extra_pp: int | None,
    mtp: bool,
    link: tuple[Sequence[str], dict, dict] | None,
) -> Layout:
    """The layout over `gpus` GPUs: the vLLM flags after -- (`extra_tp`, `extra_pp`) first, then --split, else
    from the link (`link`: the GPU indices vLLM uses, the link and peer-to-peer matrices; None when not read),
    tensor where the link would pick pipeline for a profile that drafts with MTP (`mtp`), with both reasons."""
    if extra_tp or extra_pp:
        return Layout(extra_tp or 1, extra_pp or 1, "the vLLM flags after --")
    if gpus == 1:
        return Layout(1, 1, "one GPU")
    if split:
        return Layout.of(split, gpus, f"--split {split}")
    if device != "cuda":
        return Layout.of(TENSOR, gpus, f"{device}: no GPU link to read")
    ids, links, p2p = link or ([str(i) for i in range(gpus)], {}, {})
    by_link = choose_split(ids, links, p2p)
    if mtp and by_link.pp > 1:
        return Layout.of(TENSOR, gpus, f"{MTP_TENSOR}; the link alone would pick pipeline: {by_link.reason}")
    return by_link


def link_needed(gpus: int, split: str | None, device: str, extra_sizes: bool) -> bool:
    """Whether `decide_layout` may read the GPUs' link (so nvidia-smi topo runs only then)."""
    return gpus > 1 and not split and device == "cuda" and not extra_sizes


def _smi(*args: str) -> str | None:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        r = subprocess.run([exe, *args], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout if r.returncode == 0 else None


def read_topology() -> tuple[dict[tuple[str, str], str], dict[tuple[str, str], str]]:
    """(links, peer-to-peer reads) from nvidia-smi; empty where it cannot be read."""
    return parse_matrix(_smi("topo", "-m") or ""), parse_matrix(_smi("topo", "-p2p", "r") or "")
