"""What vLLM's log says it runs, read back after start: the linear kernel each compressed-tensors scheme got.

vLLM logs "Using <Kernel> for CompressedTensorsWNA16" once per kernel it picks for a W4A16 layer
(compressed_tensors_wNa16.py `create_weights`, read in the 0.32 CPU build and in 0.34.0, where a batch-invariant
run logs "Using dequantize + batch-invariant matmul for ..."). In 0.32 (as in 0.26-0.33) int8 activations
(VLLM_MARLIN_INPUT_DTYPE=int8, marlin_utils.get_marlin_input_dtype) reach only layers whose kernel is
MarlinLinearKernel: any other kernel named for that scheme runs those layers with 16-bit activations, and vLLM
logs no activation dtype of its own. So when int8 was asked on a GPU, a non-Marlin kernel for the W4A16 scheme is
a failure (exit 7) naming the line; a log without the line leaves it unknown (a warning).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

KERNEL = re.compile(r"Using (.+?) for (CompressedTensorsW\w+)")
WNA16 = "CompressedTensorsWNA16"
INT8_KERNEL = "MarlinLinearKernel"  # the only kernel the Marlin variable's int8 activations reach


@dataclass(frozen=True)
class KernelLine:
    kernel: str
    scheme: str
    line: str


def kernel_lines(lines: Iterable[str]) -> list[KernelLine]:
    """Every "Using <Kernel> for <Scheme>" line of vLLM's log, in order."""
    out = []
    for line in lines:
        m = KERNEL.search(line)
        if m:
            out.append(KernelLine(m.group(1), m.group(2), line.strip()))
    return out


def int8_problem(lines: Iterable[str]) -> str | None:
    """The sentence saying which W4A16 layers ran 16-bit activations although int8 was asked, or None."""
    for k in kernel_lines(lines):
        if k.scheme == WNA16 and k.kernel != INT8_KERNEL:
            return (
                f"--activations int8 was asked, but vLLM runs {k.kernel} for {k.scheme} layers, which takes "
                f"16-bit activations (int8 reaches {INT8_KERNEL} only); log line: {k.line}"
            )
    return None


def read_new_lines(path: Path, offset: int) -> list[str]:
    """The log's lines written after byte `offset` (the server's own, not an earlier run's in the same file)."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace").splitlines()
    except OSError:
        return []
