"""`python -m qwenquant.testbed.hubserver [--repo Qwen/Qwen3.8-27B=models/tiny] [--dataset ID=DIR] [--port N]`.

With no --repo it serves an empty hub that takes uploads (`qwenquant publish`, HF_TOKEN set to anything)."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from qwenquant.testbed.hubserver.faults import KINDS, Fault
from qwenquant.testbed.hubserver.server import HubServer


def _pair(text: str) -> tuple[str, Path]:
    repo_id, sep, folder = text.partition("=")
    if not sep or not repo_id or not Path(folder).is_dir():
        raise argparse.ArgumentTypeError(f"expected REPO_ID=FOLDER with an existing folder, got {text!r}")
    return repo_id, Path(folder)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m qwenquant.testbed.hubserver",
        description="Serve local folders as Hugging Face Hub repos on 127.0.0.1; take uploads (Xet off).",
        epilog="example: python -m qwenquant.testbed.hubserver --repo Qwen/Qwen3.8-27B=models/tiny --port 8765\n"
        "then: HF_ENDPOINT=http://127.0.0.1:8765 HF_HUB_DISABLE_XET=1 qwenquant fetch Qwen/Qwen3.8-27B --out x\n"
        "and:  HF_ENDPOINT=http://127.0.0.1:8765 HF_HUB_DISABLE_XET=1 HF_TOKEN=x qwenquant publish x --repo me/x",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--repo", type=_pair, action="append", default=[], metavar="ID=DIR", help="model repo")
    p.add_argument("--dataset", type=_pair, action="append", default=[], metavar="ID=DIR", help="dataset repo")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--fault", action="append", default=[], metavar="KIND[:GLOB[:TIMES]]",
                   help=f"inject a fault ({', '.join(KINDS)}); TIMES 0 = always")  # fmt: skip
    args = p.parse_args(argv)
    hub = HubServer(args.host, args.port).start()
    for repo_id, folder in args.repo:
        print(f"model   {repo_id} main -> {hub.add_repo(repo_id, folder)}", flush=True)
    for repo_id, folder in args.dataset:
        print(f"dataset {repo_id} main -> {hub.add_repo(repo_id, folder, repo_type='dataset')}", flush=True)
    for spec in args.fault:
        kind, _, rest = spec.partition(":")
        glob, _, times = rest.partition(":")
        if kind not in KINDS:
            p.error(f"unknown fault kind {kind!r}; one of {', '.join(KINDS)}")
        hub.faults.add(Fault(kind, path=glob or None, times=(int(times) or None) if times else 1))
    print(f"serving on {hub.url}", flush=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    try:
        done.wait()
    except KeyboardInterrupt:
        pass
    hub.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
