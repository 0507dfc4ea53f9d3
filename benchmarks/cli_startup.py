"""Time `qwenquant --help` and each `qwenquant CMD --help` in fresh processes.

Prints a table (median and best of N runs) and writes JSON. The goal is under 0.5 s on a
2-core machine: the CLI must not import torch, transformers or llm-compressor for help.

    python -m benchmarks.cli_startup --runs 5 --out benchmarks/results/cli_startup.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path


def time_once(argv: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "qwenquant", *argv], capture_output=True, check=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/cli_startup.json"))
    args = ap.parse_args()

    import typer.main

    from qwenquant.cli import app

    cmds = sorted(typer.main.get_group(app).commands)
    rows = []
    for argv in [["--help"]] + [[c, "--help"] for c in cmds]:
        times = [time_once(argv) for _ in range(args.runs)]
        rows.append({"argv": " ".join(argv), "median_s": statistics.median(times), "best_s": min(times)})
    width = max(len(r["argv"]) for r in rows)
    print(f"{'command':<{width}}  median_s  best_s")
    for r in rows:
        print(f"{r['argv']:<{width}}  {r['median_s']:8.3f}  {r['best_s']:6.3f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"runs": args.runs, "python": sys.version, "rows": rows}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
