"""The longest context one GPU held to a hard 24 GiB serves with MTP on, one server ("arm") at a time.

Each arm starts vLLM from the command `qwenquant serve ART --profile P --gpu-mem 24GiB --[no-]host-embeddings
--dry-run --json` prints (with its ballast holding the rest of the GPU, and for `hostemb=1` the environment that
switches scripts/vllm-host-embeddings/plugin on), with the arm's flags after `--`. The dry run's command is used rather than
`qwenquant serve` itself so that an arm serve's budget check would refuse (a context the plan says does not fit) is
still measured; each arm records the dry run's failures beside vLLM's figures. `mml=auto` passes vLLM's own
`--max-model-len auto` (the largest length whose one sequence fits its KV cache, vLLM >= 0.26).

Per arm: vLLM's memory figures from its DEBUG log (weights, torch peak, non-torch, CUDA graph estimate, available
KV memory, KV tokens, the max_model_len it settled on), then fresh prompts of random token ids (never seen before by
the server, so no prefix cache hit) at the arm's fill lengths, each streamed with `decode` greedy tokens: TTFT,
prefill tok/s (prompt tokens / TTFT), decode tok/s. Every prompt's token count is checked twice: the server's
`usage.prompt_tokens` against the ids sent, and the delta of vLLM's `vllm:prompt_tokens_total` counter; a
disagreement is printed as DISAGREE and kept in the JSON. `max` in `fills` is the server's max_model_len minus the
decode tokens minus 8 (room for the draft tokens).

  python -m benchmarks.long_context ART --vllm .venv-vllm/qwenquant-vllm.json --out lc.json \\
      --arm 'A:hostemb=1,mml=auto,fills=' --arm 'B:hostemb=1,mml=auto,chunk=512,util=0.95,fills=1024+32768+131072+max'

Arm keys: hostemb (0/1), mml (tokens or auto), chunk (--max-num-batched-tokens), util (--gpu-memory-utilization,
of the --gpu-mem size), fills (prompt lengths joined by +; `max` allowed), decode (tokens, default 128), profile
(default long-context), extra (more vLLM flags, `;`-separated). Progress goes line by line to --progress.
Expectations, written before the run: benchmarks/README.md "Long context on one 24 GiB card".
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

from benchmarks.serve_cuda_bench import parse_vllm_log
from benchmarks.serving import cli_env, qwenquant_cli

HOST_EMBEDDINGS = "QWENQUANT_HOST_EMBEDDINGS"
EXTRA_PATTERNS = {
    "non_torch_gib": r"non-torch forward increase memory: ([0-9.]+) ?GiB",
    "cudagraph_estimate_gib": r"CUDA graph pool memory: [0-9.]+ ?GiB \(actual\), ([0-9.]+) ?GiB \(estimated\)",
    "autofit_len": r"Auto-fit max_model_len: (?:reduced from [0-9,]+ to |full model context length )([0-9,]+)",
}


def parse_arm(text: str) -> dict[str, Any]:
    name, _, body = text.partition(":")
    arm: dict[str, Any] = {
        "name": name,
        "hostemb": 1,
        "mml": "auto",
        "chunk": None,
        "util": None,
        "fills": [],
        "decode": 128,
        "profile": "long-context",
        "extra": [],
    }
    for part in filter(None, body.split(",")):
        key, _, value = part.partition("=")
        if key not in arm or key == "name":
            raise SystemExit(f"--arm {text!r}: unknown key {key!r}")
        if key == "fills":
            arm[key] = [v if v == "max" else int(v) for v in value.split("+") if v]
        elif key == "extra":
            arm[key] = [v for v in value.split(";") if v]
        elif key in ("hostemb", "chunk", "decode"):
            arm[key] = int(value)
        elif key == "util":
            arm[key] = float(value)
        else:
            arm[key] = value
    return arm


class Progress:
    def __init__(self, path: Path | None) -> None:
        self.path, self.t0 = path, time.monotonic()

    def __call__(self, **kw: Any) -> None:
        kw["t"] = round(time.monotonic() - self.t0, 1)
        line = json.dumps(kw)
        print(line, flush=True)
        if self.path:
            with self.path.open("a") as f:
                f.write(line + "\n")


def dry_run(art: str, vllm: str, arm: dict[str, Any], gpu_mem: str) -> dict[str, Any]:
    """`serve --dry-run --json` for the arm (a placeholder length stands for `auto`, replaced in the command)."""
    after = ["--max-model-len", "262144" if arm["mml"] == "auto" else str(arm["mml"])]
    if arm["chunk"]:
        after += ["--max-num-batched-tokens", str(arm["chunk"])]
    if arm["util"]:  # of the --gpu-mem card, as a profile's share is: the same share of this GPU serve would pass
        from qwenquant.plan.gpumem import parse_size, utilization_for

        after += ["--gpu-memory-utilization", str(utilization_for(parse_size(gpu_mem), gpu_total(), arm["util"]))]
    switch = "--host-embeddings" if arm["hostemb"] else "--no-host-embeddings"
    proc = qwenquant_cli(
        "serve",
        art,
        "--profile",
        arm["profile"],
        "--gpu-mem",
        gpu_mem,
        "--vllm",
        vllm,
        switch,
        "--dry-run",
        "--json",
        "--",
        *after,
        *arm["extra"],
        env=cli_env(),
        timeout=600,
    )
    plan = json.loads(proc.stdout)
    cmd = list(plan["command"])
    if arm["mml"] == "auto":
        cmd[cmd.index("--max-model-len") + 1] = "auto"
    plan["command"] = cmd
    return plan


def vllm_figures(log: str) -> dict[str, Any]:
    out: dict[str, Any] = dict(parse_vllm_log(log))
    for key, pattern in EXTRA_PATTERNS.items():
        found = re.findall(pattern, log)
        if found:
            out[key] = float(found[-1].replace(",", ""))
    out["host_embeddings_lines"] = [line[-200:] for line in log.splitlines() if "host embeddings" in line][:4]
    out["memory_lines"] = [
        line[-300:] for line in log.splitlines() if re.search(r"memory|KV cache|Auto-fit|graph", line, re.I)
    ][-30:]
    return out


def _get(url: str, timeout: float = 10) -> bytes:
    import urllib.request

    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


def counter(base: str, name: str) -> float:
    """A vLLM counter from /metrics, summed over its label sets."""
    text = _get(f"{base}/metrics").decode()
    return sum(float(v) for v in re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+]+)$", text, re.M))


def fill(base: str, model: str, n: int, decode: int, rng: random.Random) -> dict[str, Any]:
    """One fresh prompt of `n` random token ids, `decode` greedy tokens streamed: the timings and both counts."""
    import urllib.request

    ids = [rng.randrange(1000, 200000) for _ in range(n)]
    body = json.dumps(
        {
            "model": model,
            "prompt": ids,
            "max_tokens": decode,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    ).encode()
    before = counter(base, "vllm:prompt_tokens_total"), counter(base, "vllm:generation_tokens_total")
    req = urllib.request.Request(f"{base}/v1/completions", body, {"Content-Type": "application/json"})
    t0 = time.monotonic()
    first = None
    usage: dict[str, Any] = {}
    with urllib.request.urlopen(req, timeout=1800) as r:
        for raw in r:
            s = raw.decode().strip()
            if not s.startswith("data: ") or s == "data: [DONE]":
                continue
            ev = json.loads(s[6:])
            usage = ev.get("usage") or usage
            if first is None and ev.get("choices") and ev["choices"][0].get("text") is not None:
                first = time.monotonic()
    end = time.monotonic()
    after = counter(base, "vllm:prompt_tokens_total"), counter(base, "vllm:generation_tokens_total")
    pt, ct = usage.get("prompt_tokens"), usage.get("completion_tokens")
    out: dict[str, Any] = {
        "prompt_sent": n,
        "prompt_tokens": pt,
        "completion_tokens": ct,
        "metrics_prompt_tokens": after[0] - before[0],
        "metrics_generation_tokens": after[1] - before[1],
    }
    if first is not None and pt:
        out.update(ttft_s=round(first - t0, 3), prefill_tok_s=round(pt / (first - t0), 1))
        if ct and ct > 1 and end > first:
            out["decode_tok_s"] = round((ct - 1) / (end - first), 2)
    out["agree"] = pt == n == out["metrics_prompt_tokens"] and ct == out["metrics_generation_tokens"]
    if not out["agree"]:
        out["DISAGREE"] = "sent / usage / metrics counts differ"
    return out


def _stop(*procs: subprocess.Popen) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    for p in procs:
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def gpu_total() -> int:
    """GPU 0's memory in bytes (nvidia-smi, MiB)."""
    proc = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits", "-i", "0"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(proc.stdout.strip()) * 2**20


def gpu_use() -> list[str]:
    """nvidia-smi's per-process memory (the ballast and vLLM), for the record."""
    proc = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader"], capture_output=True, text=True
    )
    return proc.stdout.strip().splitlines()


def run_arm(a: argparse.Namespace, arm: dict[str, Any], say: Progress) -> dict[str, Any]:
    plan = dry_run(a.artifact, a.vllm, arm, a.gpu_mem)
    rec: dict[str, Any] = {
        "arm": arm,
        "command": plan["command"],
        "dry_run_failures": plan.get("failures"),
        "dry_run_warnings": plan.get("warnings"),
        "ballast": plan.get("ballast"),
    }
    say(arm=arm["name"], stage="dry-run", failures=plan.get("failures"))
    from qwenquant.procenv import server_env

    env = server_env(dict(os.environ, **plan["env"], VLLM_LOGGING_LEVEL="DEBUG"))  # without qwenquant's import path
    for k in plan.get("env_unset", []):
        env.pop(k, None)
    if (env.get(HOST_EMBEDDINGS) == "1") != bool(arm["hostemb"]):
        raise SystemExit(
            f"arm {arm['name']}: serve's plan set {HOST_EMBEDDINGS}={env.get(HOST_EMBEDDINGS)} for "
            f"hostemb={arm['hostemb']}"
        )
    log_path = Path(a.logs) / f"{arm['name']}.vllm.log"
    ballast = subprocess.Popen(plan["ballast"], stdout=subprocess.PIPE, text=True, start_new_session=True)
    rec["ballast_line"] = (ballast.stdout.readline() if ballast.stdout else "").strip()
    with log_path.open("w") as log:
        srv = subprocess.Popen(plan["command"], stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    cmd = plan["command"]
    base = f"http://127.0.0.1:{cmd[cmd.index('--port') + 1]}"
    t0 = time.monotonic()
    try:
        up = False
        while time.monotonic() - t0 < a.ready_timeout and srv.poll() is None:
            try:
                up = _get(f"{base}/health", 5) is not None
                break
            except OSError:
                time.sleep(3)
        rec["ready_s"] = round(time.monotonic() - t0, 1) if up else None
        rec["vllm"] = vllm_figures(log_path.read_text(errors="replace"))
        say(
            arm=arm["name"],
            stage="start",
            up=up,
            exit=srv.poll(),
            **{k: v for k, v in rec["vllm"].items() if k != "memory_lines"},
        )
        if not up:
            rec["log_tail"] = log_path.read_text(errors="replace")[-5000:]
            return rec
        info = json.loads(_get(f"{base}/v1/models"))["data"][0]
        rec["served_max_model_len"] = info.get("max_model_len")
        rng = random.Random(zlib.crc32(arm["name"].encode()))
        rec["fills"] = []
        for n in [1024] + arm["fills"]:
            length = info["max_model_len"] - arm["decode"] - 8 if n == "max" else n
            try:
                r = fill(base, info["id"], length, arm["decode"], rng)
            except Exception as e:  # recorded: the arm's figures so far stay
                r = {"prompt_sent": length, "error": repr(e)[:400], "server_alive": srv.poll() is None}
            rec["fills"].append(r)
            say(arm=arm["name"], stage="fill", **r)
            if "error" in r:
                break
        rec["gpu_use"] = gpu_use()
        spec = {
            k: counter(base, f"vllm:spec_decode_num_{k}_total") for k in ("drafts", "draft_tokens", "accepted_tokens")
        }
        rec["spec_decode"] = spec
        return rec
    finally:
        _stop(srv, ballast)
        rec["log_tail_after_stop"] = log_path.read_text(errors="replace").splitlines()[-5:]
        say(arm=arm["name"], stage="stopped")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("artifact")
    ap.add_argument("--vllm", required=True, help="the launcher JSON scripts/install-vllm.sh wrote")
    ap.add_argument("--arm", action="append", required=True, help="NAME:key=value,... (see above)")
    ap.add_argument("--gpu-mem", default="24GiB")
    ap.add_argument("--ready-timeout", type=float, default=900)
    ap.add_argument("--logs", default=".", help="folder for each arm's vLLM log")
    ap.add_argument("--progress", type=Path, help="JSON lines as the run goes")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    arms = [parse_arm(t) for t in a.arm]
    say = Progress(a.progress)
    report: dict[str, Any] = {"schema_version": 1, "artifact": a.artifact, "gpu_mem": a.gpu_mem, "arms": []}
    for arm in arms:
        report["arms"].append(run_arm(a, arm, say))
        a.out.write_text(json.dumps(report, indent=1))
    print(table(report))
    return 0


def table(report: dict[str, Any]) -> str:
    lines = [
        "| arm | weights GiB | torch peak GiB | non-torch GiB | graphs est. GiB | KV GiB | KV tokens | max_model_len |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for rec in report["arms"]:
        v = rec.get("vllm", {})
        lines.append(
            f"| {rec['arm']['name']} | {v.get('weights_gib', '-')} | {v.get('peak_activation_gib', '-')} | "
            f"{v.get('non_torch_gib', '-')} | {v.get('cudagraph_estimate_gib', '-')} | "
            f"{v.get('kv_available_gib', '-')} | {v.get('kv_tokens', '-')} | {rec.get('served_max_model_len')} |"
        )
    lines += [
        "",
        "| arm | prompt | TTFT s | prefill tok/s | decode tok/s | counts agree |",
        "|---|---|---|---|---|---|",
    ]
    for rec in report["arms"]:
        for f in rec.get("fills", []):
            lines.append(
                f"| {rec['arm']['name']} | {f.get('prompt_tokens', f['prompt_sent'])} | {f.get('ttft_s', '-')} | "
                f"{f.get('prefill_tok_s', '-')} | {f.get('decode_tok_s', '-')} | "
                f"{f.get('agree', f.get('error', '-'))} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
