"""Cost of verification: plain `snapshot_download` vs `qwenquant fetch` from the loopback hub.

    .venv/bin/python -m benchmarks.fetch_bench --size-gib 1.0 --repeat 3 --out benchmarks/results/fetch.json

Builds a >= 1 GiB Qwen3.5-shaped checkpoint (valid safetensors shards + index + config, random
bytes), serves it from `python -m qwenquant.testbed.hubserver` in its own process, then alternates:
  plain     huggingface_hub.snapshot_download(local_dir=...)       (size check only)
  verified  qwenquant.fetch.fetch_snapshot(...)                    (sha256/git-sha1 of every byte,
                                                                    header + index checks, fsync, record)
and, as a floor, `raw`: the same GETs through huggingface_hub's session written to disk, no hashing.
Prints a table (median of --repeat runs) and writes JSON. Goal: verified / plain <= 1.25.

Expectation written before the first run (2-core VM, SHA-NI): ratio about 1.10-1.20, hashing
overlapping the transfer on the second core; a ratio below 0.85 would be too good to believe
(verified would then be skipping work, or the plain run measuring something else).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_DISABLE_XET", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

REPO = "Qwen/Qwen3.8-27B"


def build_checkpoint(folder: Path, size_gib: float, shards: int = 4) -> int:
    """Valid safetensors shards of random bytes (U8 tensors of 64 MiB), an index and a config."""
    folder.mkdir(parents=True, exist_ok=True)
    tensor_bytes = 64 << 20
    per_shard = max(1, int(size_gib * (1 << 30) / tensor_bytes / shards + 0.999))
    weight_map: dict[str, str] = {}
    total = 0
    for s in range(shards):
        name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        names = [f"model.language_model.layers.{s * per_shard + i}.mlp.weight" for i in range(per_shard)]
        header = {n: {"dtype": "U8", "shape": [tensor_bytes], "data_offsets": [i * tensor_bytes, (i + 1) * tensor_bytes]}
                  for i, n in enumerate(names)}  # fmt: skip
        raw = json.dumps(header).encode()
        raw += b" " * (-len(raw) % 8)
        with open(folder / name, "wb") as f:
            f.write(struct.pack("<Q", len(raw)) + raw)
            for _ in names:
                f.write(os.urandom(tensor_bytes))
        weight_map.update(dict.fromkeys(names, name))
        total += (folder / name).stat().st_size
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map})
    )
    (folder / "config.json").write_text(
        json.dumps({"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5"})
    )
    (folder / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 262144}))
    return sum(p.stat().st_size for p in folder.iterdir())


def start_server(folder: Path) -> tuple[subprocess.Popen, str]:
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.Popen([sys.executable, "-m", "qwenquant.testbed.hubserver", "--repo", f"{REPO}={folder}"],
                            stdout=subprocess.PIPE, text=True, env=env)  # fmt: skip
    while True:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise SystemExit("hub server did not start")
        if line.startswith("serving on "):
            return proc, line.split()[-1]


def run_plain(url: str, out: Path, workers: int) -> float:
    from huggingface_hub import snapshot_download

    t = time.perf_counter()
    snapshot_download(REPO, endpoint=url, local_dir=out, max_workers=workers)
    return time.perf_counter() - t


def run_verified(url: str, out: Path, workers: int) -> float:
    from qwenquant.fetch import fetch_snapshot

    t = time.perf_counter()
    result = fetch_snapshot(REPO, out, endpoint=url, workers=workers)
    secs = time.perf_counter() - t
    # A fast run must still have moved and hashed every byte: no reuse, no skipped files.
    want = sum(f["size"] for f in result.record["files"])
    if result.reused_files or result.downloaded_bytes != want:
        raise SystemExit(f"verified run skipped work: {result.downloaded_bytes} of {want} bytes downloaded")
    return secs


def run_raw(url: str, out: Path, workers: int) -> float:
    """The floor: the same GETs through huggingface_hub's session, written to disk, no hashing."""
    from concurrent.futures import ThreadPoolExecutor

    from huggingface_hub import HfApi, hf_hub_url
    from huggingface_hub.utils import get_session

    t = time.perf_counter()
    files = [f for f in HfApi(endpoint=url).list_repo_tree(REPO, recursive=True) if hasattr(f, "blob_id")]
    out.mkdir(parents=True, exist_ok=True)

    def one(f) -> None:
        with get_session().stream("GET", hf_hub_url(REPO, f.path, endpoint=url), follow_redirects=True) as r:
            with open(out / f.path, "wb") as fh:
                for chunk in r.iter_bytes():
                    fh.write(chunk)

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, files))
    return time.perf_counter() - t


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size-gib", type=float, default=1.0)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--src", type=Path, help="reuse/build the checkpoint here (default: a temp folder)")
    p.add_argument("--scratch", type=Path, help="where downloads go (default: a temp folder)")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/fetch_bench.json"))
    args = p.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="fetch-bench-"))
    src = args.src or tmp / "src"
    if not (src / "config.json").exists():
        print(f"building a {args.size_gib} GiB checkpoint in {src} ...", file=sys.stderr)
    total = build_checkpoint(src, args.size_gib) if not (src / "config.json").exists() else sum(
        f.stat().st_size for f in src.iterdir())  # fmt: skip
    for f in src.iterdir():  # warm the page cache so the first run is not penalised
        with open(f, "rb") as fh:
            while fh.read(64 << 20):
                pass
    scratch = args.scratch or tmp / "dl"
    proc, url = start_server(src)
    times: dict[str, list[float]] = {"raw": [], "plain": [], "verified": []}
    runs = [("raw", run_raw), ("plain", run_plain), ("verified", run_verified)]
    try:
        for i in range(args.repeat):
            for name, fn in runs[i % 3 :] + runs[: i % 3]:  # rotate the order between rounds
                out = scratch / f"{name}-{i}"
                secs = fn(url, out, args.workers)
                times[name].append(secs)
                print(f"  run {i} {name:8s} {secs:6.2f} s", file=sys.stderr)
                shutil.rmtree(out, ignore_errors=True)
    finally:
        proc.terminate()
        proc.wait(10)
        if args.src is None:
            shutil.rmtree(tmp, ignore_errors=True)

    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = med["verified"] / med["plain"]
    print(f"\nfetch bench: {total / 2**30:.2f} GiB, {args.workers} workers, median of {args.repeat}, "
          f"{os.cpu_count()} CPUs, {platform.machine()}")  # fmt: skip
    print(f"{'method':10s} {'seconds':>8s} {'MiB/s':>8s} {'runs':>24s}")
    for k in ("raw", "plain", "verified"):
        runs = " ".join(f"{t:.2f}" for t in times[k])
        print(f"{k:10s} {med[k]:8.2f} {total / 2**20 / med[k]:8.0f} {runs:>24s}")
    print(f"ratio verified/plain: {ratio:.3f} (goal <= 1.25); verified/raw: {med['verified'] / med['raw']:.3f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "bytes": total, "workers": args.workers, "repeat": args.repeat, "cpus": os.cpu_count(),
        "machine": platform.platform(), "python": platform.python_version(),
        "seconds": times, "median": med, "ratio": ratio, "goal": 1.25,
    }, indent=2) + "\n")  # fmt: skip
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
