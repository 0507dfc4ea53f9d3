"""The README's quality table for the committed tiny reference model, from one command.

    .venv/bin/python -m benchmarks.eval_reference --work /tmp/evalref-bench --out benchmarks/reports/eval_reference.json

Every step is the real CLI: build the reference checkpoint (`qwenquant.testbed.tiny.reference_model`);
`qwenquant quantize` (w4a16-int4head, tiny-reference calibration); `qwenquant eval offline ARTIFACT
--reference SOURCE --windows 64`; then, when a vLLM environment is installed (and not --no-serve),
serve the artifact (`qwenquant serve --profile single-user`) and the bf16 source (the same vLLM
command with the source folder and --language-model-only) in turn, and run `qwenquant eval
--served` against each. Prints a markdown table and writes JSON.

Expectation written before the first run: W4A16 body within about 1-3% of bf16 perplexity; the
calibrated int4 head well under the round-to-nearest head's KL (ratio 0.3-0.5); MTP acceptance
length of the bf16 source 1.3-1.8 with 3 drafts and the artifact within 5% of it. Too good to
believe: any quantized arm with perplexity below bf16 by more than its CI, or a head KL ratio
below 0.05 (the head would not be int4).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
from pathlib import Path

from qwenquant.evaluate.report import as_offline, parse_report

REPO = Path(__file__).resolve().parents[1]
LAUNCHER = REPO / ".venv-vllm" / "qwenquant-vllm.json"


def qq(*args: str, env: dict[str, str], capture: bool = True, timeout: int = 3600) -> subprocess.CompletedProcess:
    print("$ qwenquant " + shlex.join(args), file=sys.stderr, flush=True)
    return subprocess.run(
        [sys.executable, "-m", "qwenquant", *args],
        env=env,
        capture_output=capture,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _served_eval(argv: list[str], env: dict[str, str], url: str, log: Path) -> dict:
    """Start a server from `argv`, wait until it serves a model (serving.wait_ready), run `qwenquant eval served
    URL`, stop it."""
    from benchmarks.serving import wait_ready

    with open(log, "w") as f:
        proc = subprocess.Popen(argv, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        try:
            wait_ready(url, proc, timeout=900)
        except RuntimeError as e:
            raise RuntimeError(f"{e}; see {log}") from None
        r = qq("eval", "served", url, "--json", env=env)
        return parse_report(r.stdout, "eval served --json").to_json() if r.stdout else {"error": r.stderr[-2000:]}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=120)


def _vllm_argv(
    art: Path, model: Path, port: int, env: dict[str, str], source: bool
) -> tuple[list[str], dict[str, str]]:
    """The command `qwenquant serve --dry-run` prints for the artifact, pointed at `model`."""
    r = qq(
        "serve",
        str(art),
        "--profile",
        "single-user",
        "--port",
        str(port),
        "--vllm",
        str(LAUNCHER),
        "--dry-run",
        "--",
        "--max-model-len",
        "2048",
        env=env,
    )
    line = [x for x in r.stdout.splitlines() if "vllm" in x and "--model" in x][0]
    words = shlex.split(line)
    cmd_start = next(i for i, w in enumerate(words) if "=" not in w or w.startswith("-"))
    run_env = dict(env, **dict(w.split("=", 1) for w in words[:cmd_start]))
    argv = words[cmd_start:]
    argv[argv.index("--model") + 1] = str(model)
    if source and "--language-model-only" not in argv:
        argv.append("--language-model-only")
    return argv, run_env


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--windows", type=int, default=64)
    p.add_argument("--no-serve", action="store_true")
    p.add_argument(
        "--calibration",
        default="tiny-reference",
        help="quantize's calibration set, name or YAML (default tiny-reference: the README's table)",
    )
    a = p.parse_args()
    from qwenquant.testbed.tiny.reference_model import build_reference_checkpoint

    env = dict(
        os.environ, QWENQUANT_THREADS="2", QWENQUANT_NO_PROGRESS="1", PYTHONHASHSEED="0", VLLM_CPU_KVCACHE_SPACE="1"
    )
    src, art = build_reference_checkpoint(a.work / "source"), a.work / "artifact"
    if not (art / "qwenquant-manifest.json").exists():
        q = qq(
            "quantize",
            str(src),
            "--recipe",
            "w4a16-int4head",
            "--calibration",
            a.calibration,
            "--source-unverified",
            "--out",
            str(art),
            "--json",
            env=env,
        )
        assert q.returncode == 0, q.stderr[-3000:]
    e = qq("eval", "offline", str(art), "--reference", str(src), "--windows", str(a.windows), "--json", env=env)
    assert e.returncode == 0, e.stderr[-3000:]
    result = {"offline": parse_report(e.stdout, "eval offline --json").to_json(), "served": {}}
    if not a.no_serve and LAUNCHER.exists():
        for name, model in (("artifact", art), ("bf16", src)):
            port = _port()
            argv, run_env = _vllm_argv(art, model, port, env, source=name == "bf16")
            result["served"][name] = _served_eval(argv, run_env, f"http://127.0.0.1:{port}", a.work / f"{name}.log")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(table(result))
    return 0


def table(result: dict) -> str:
    """Markdown: one row per arm (perplexity, delta, KL, top-1), then the head and MTP rows."""
    off = as_offline(result["offline"])
    rows = [
        "| arm | perplexity | delta vs bf16 [95% CI] | windows worse | KL (nats) | top-1 |",
        "|---|---|---|---|---|---|",
        f"| bf16 source | {off.arms.reference.ppl:.3f} | | | | |",
    ]
    for name, x in off.arms.compared()[:3]:  # w4a16-body, w4a16+rtn-head, artifact
        rows.append(
            f"| {name} | {x.ppl:.3f} | {x.delta_pct:+.2f}% [{x.ci95_pct[0]:+.2f}, {x.ci95_pct[1]:+.2f}] | "
            f"{x.windows_worse}/{x.windows} | {x.kl:.4f} | {100 * x.top1:.1f}% |"
        )
    h = off.lm_head
    rows.append(f"\nlm_head alone: KL rtn {h.rtn.kl:.4f}, calibrated {h.gptq.kl:.4f} (ratio {h.ratio:.3f})")
    for name, s in result["served"].items():
        m = s.get("mtp", {})
        pos = ", ".join(f"{k}: {100 * v:.1f}%" for k, v in m.get("per_position", {}).items() if v is not None)
        rows.append(f"served {name}: mean acceptance length {m.get('mean_acceptance_length')}, per position {pos}")
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
