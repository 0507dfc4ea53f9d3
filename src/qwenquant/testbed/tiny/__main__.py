"""`python -m qwenquant.testbed.tiny OUT_DIR [--variant random|constant|reference] [--seed N]`"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from qwenquant.errors import QwenquantError
from qwenquant.testbed.tiny import VARIANTS, build_tiny_checkpoint


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m qwenquant.testbed.tiny",
        description="Write a deterministic tiny Qwen3.5 checkpoint.",
        epilog="example: python -m qwenquant.testbed.tiny /tmp/tiny --variant constant --seed 0",
    )
    parser.add_argument("out_dir", type=Path)
    parser.add_argument(
        "--variant",
        choices=(*VARIANTS, "reference"),
        default="random",
        help="reference: the demo's trained model (seed ignored); random/constant: the tests' models",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        if args.variant == "reference":
            from qwenquant.testbed.tiny.reference_model import build_reference_checkpoint

            path = build_reference_checkpoint(args.out_dir)
        else:
            path = build_tiny_checkpoint(args.out_dir, variant=args.variant, seed=args.seed)
    except QwenquantError as exc:
        print(f"error: {exc.message}" + (f"\nhint: {exc.hint}" if exc.hint else ""), file=sys.stderr)
        return exc.exit_code
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
