#!/usr/bin/env python3
"""Start vLLM from .venv-vllm on a checkpoint, check the OpenAI API, stop it; print a JSON report.

Stdlib only (runs under any Python >= 3.10). A manual check and a recipe for the serve tests:

  python3 scripts/vllm-cpu/smoke_serve.py /path/to/checkpoint
  python3 scripts/vllm-cpu/smoke_serve.py /path/to/checkpoint --mtp 2
  python3 scripts/vllm-cpu/smoke_serve.py /path/to/checkpoint --extra=--language-model-only

It reads the interpreter and entry point from .venv-vllm/qwenquant-vllm.json (written by
scripts/install-vllm.sh), binds 127.0.0.1 on a free port, waits for /health, then checks
/v1/models, a greedy /v1/completions and /v1/chat/completions, and (with --mtp) the
vllm:spec_decode_* counters on /metrics. Time to ready and the RSS of the server's process tree
(API server + engine core) are measured. The server log is kept in --log.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(url: str, body: dict | None = None, timeout: float = 120.0) -> tuple[int, str]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def tree_rss_mib(pid: int) -> float:
    """Sum of VmRSS over `pid` and its descendants (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            ppid = int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(p.name))
    total_kib, todo = 0, [pid]
    while todo:
        q = todo.pop()
        todo.extend(children.get(q, []))
        try:
            for line in Path(f"/proc/{q}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total_kib += int(line.split()[1])
        except OSError:
            pass
    return total_kib / 1024


def server_argv(info: dict, model: str, port: int, args: argparse.Namespace) -> list[str]:
    argv = [
        *info["entrypoint"],
        "--model",
        model,
        "--served-model-name",
        "tiny",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        str(args.max_model_len),
        "--dtype",
        "bfloat16",
    ]
    if info.get("device") == "cpu":
        # Eager: no torch.compile warm-up; prefix caching hits a Triton-only kernel with MTP on CPU.
        argv += ["--enforce-eager", "--no-enable-prefix-caching"]
    if args.mtp:
        argv += ["--speculative-config", json.dumps({"method": "mtp", "num_speculative_tokens": args.mtp})]
    return argv + list(args.extra)


def spec_metrics(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("vllm:spec_decode_"):
            name, _, value = line.rpartition(" ")
            out[name] = out.get(name, 0.0) + float(value)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--mtp", type=int, default=0, help="num_speculative_tokens (0: no MTP)")
    ap.add_argument("--max-model-len", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--prompt", default="hello world")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--extra", action="append", default=[], help="extra server argument (repeatable)")
    ap.add_argument("--info", default=str(REPO / ".venv-vllm" / "qwenquant-vllm.json"))
    ap.add_argument("--log", default="vllm-smoke.log")
    ap.add_argument("--ready-timeout", type=float, default=300.0)
    args = ap.parse_args()

    info = json.loads(Path(args.info).read_text())
    port = free_port()
    argv = server_argv(info, args.model, port, args)
    env = dict(os.environ)
    if info.get("device") == "cpu":
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache; the default is far larger
    base = f"http://127.0.0.1:{port}"
    report: dict = {"argv": argv, "env": {k: env[k] for k in env if k.startswith("VLLM_")}}
    t0 = time.monotonic()
    with open(args.log, "w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        while True:
            if proc.poll() is not None:
                report["error"] = f"server exited with {proc.returncode} before ready; see {args.log}"
                print(json.dumps(report, indent=2))
                return 1
            try:
                if http(base + "/health", timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() - t0 > args.ready_timeout:
                report["error"] = f"not ready after {args.ready_timeout} s; see {args.log}"
                print(json.dumps(report, indent=2))
                return 1
            time.sleep(0.5)
        report["ready_s"] = round(time.monotonic() - t0, 1)
        report["rss_mib_ready"] = round(tree_rss_mib(proc.pid))
        report["models"] = [m["id"] for m in json.loads(http(base + "/v1/models")[1])["data"]]
        t = time.monotonic()
        code, body = http(
            base + "/v1/completions",
            {"model": "tiny", "prompt": args.prompt, "max_tokens": args.max_tokens, "temperature": args.temperature},
        )
        report["completion_s"] = round(time.monotonic() - t, 2)
        report["completion"] = json.loads(body)["choices"][0] if code == 200 else {"status": code, "body": body}
        code, body = http(
            base + "/v1/chat/completions",
            {
                "model": "tiny",
                "messages": [{"role": "user", "content": args.prompt}],
                "max_tokens": args.max_tokens,
                "temperature": args.temperature,
            },
        )
        report["chat"] = json.loads(body)["choices"][0] if code == 200 else {"status": code, "body": body}
        report["rss_mib_after"] = round(tree_rss_mib(proc.pid))
        report["spec_decode"] = spec_metrics(http(base + "/metrics")[1])
        ok = "error" not in report and all("status" not in report[k] for k in ("completion", "chat"))
    finally:
        # SIGTERM the API server only: it stops its engine core and worker itself (signalling the
        # whole group at once makes the engine die first and logs an EngineDeadError).
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        try:  # anything left of the server's process group (engine core, worker)
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    print(json.dumps(report, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
