"""`PYTHONPATH=tests python -m support.hubserver [--repo ID=DIR] [--fault KIND[:GLOB[:TIMES]]] [--port N]`: the
tests' hub in its own process. With no --repo it serves an empty hub that takes uploads (`qwenquant publish`,
HF_TOKEN set to anything)."""

from __future__ import annotations

import sys

from qwenquant.testbed.hubserver.__main__ import parser, serve

from support.hubserver.faults import KINDS, Fault
from support.hubserver.server import HubServer


def main(argv: list[str] | None = None) -> int:
    p = parser(
        "python -m support.hubserver",
        "Serve local folders as Hugging Face Hub repos on 127.0.0.1; take uploads (Xet off); inject faults.",
        "example: PYTHONPATH=tests python -m support.hubserver --repo Qwen/Qwen3.8-27B=models/tiny --port 8765\n"
        "then: HF_ENDPOINT=http://127.0.0.1:8765 HF_HUB_DISABLE_XET=1 qwenquant fetch Qwen/Qwen3.8-27B --out x\n"
        "and:  HF_ENDPOINT=http://127.0.0.1:8765 HF_HUB_DISABLE_XET=1 HF_TOKEN=x qwenquant publish x --repo me/x",
    )
    p.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="KIND[:GLOB[:TIMES]]",
        help=f"inject a fault ({', '.join(KINDS)}); TIMES 0 = always",
    )
    args = p.parse_args(argv)
    hub = HubServer(args.host, args.port).start()
    for spec in args.fault:
        kind, _, rest = spec.partition(":")
        glob, _, times = rest.partition(":")
        if kind not in KINDS:
            p.error(f"unknown fault kind {kind!r}; one of {', '.join(KINDS)}")
        hub.faults.add(Fault(kind, path=glob or None, times=(int(times) or None) if times else 1))
    return serve(hub, args)


if __name__ == "__main__":
    sys.exit(main())
