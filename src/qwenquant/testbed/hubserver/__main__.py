"""`python -m qwenquant.testbed.hubserver --repo Qwen/Qwen3.8-27B=models/tiny [--dataset ID=DIR] [--port N]`:
serve local folders as Hub repos on 127.0.0.1 until Ctrl-C or SIGTERM (downloads only; the tests' hub,
`python -m support.hubserver` with tests/ on PYTHONPATH, also takes uploads and fault switches)."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from qwenquant.testbed.hubserver.server import HubServer


def folder_pair(text: str) -> tuple[str, Path]:
    """REPO_ID=FOLDER, the folder existing."""
    repo_id, sep, folder = text.partition("=")
    if not sep or not repo_id or not Path(folder).is_dir():
        raise argparse.ArgumentTypeError(f"expected REPO_ID=FOLDER with an existing folder, got {text!r}")
    return repo_id, Path(folder)


def parser(prog: str, description: str, epilog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog, description=description, epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--repo", type=folder_pair, action="append", default=[], metavar="ID=DIR", help="model repo")
    p.add_argument("--dataset", type=folder_pair, action="append", default=[], metavar="ID=DIR", help="dataset repo")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    return p


def serve(hub: HubServer, args: argparse.Namespace) -> int:
    """Add the repos of `args` to the started `hub`, say its URL, serve until SIGTERM or Ctrl-C."""
    for repo_id, folder in args.repo:
        print(f"model   {repo_id} main -> {hub.add_repo(repo_id, folder)}", flush=True)
    for repo_id, folder in args.dataset:
        print(f"dataset {repo_id} main -> {hub.add_repo(repo_id, folder, repo_type='dataset')}", flush=True)
    print(f"serving on {hub.url}", flush=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    try:
        done.wait()
    except KeyboardInterrupt:
        pass
    hub.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = parser(
        "python -m qwenquant.testbed.hubserver",
        "Serve local folders as Hugging Face Hub repos on 127.0.0.1 (downloads).",
        "example: python -m qwenquant.testbed.hubserver --repo Qwen/Qwen3.8-27B=models/tiny --port 8765\n"
        "then: HF_ENDPOINT=http://127.0.0.1:8765 HF_HUB_DISABLE_XET=1 qwenquant fetch Qwen/Qwen3.8-27B --out x",
    )
    args = p.parse_args(argv)
    return serve(HubServer(args.host, args.port).start(), args)


if __name__ == "__main__":
    sys.exit(main())
