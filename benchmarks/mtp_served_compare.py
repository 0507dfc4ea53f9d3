"""Served MTP acceptance of the trained tiny reference: bf16 MTP head against the calibrated int4 one.

    python3 -m benchmarks.mtp_served_compare --work /tmp/mtp --out benchmarks/reports/mtp_served_compare.json -- --max-model-len 4096
    python3 -m benchmarks.mtp_served_compare --work /tmp/mtp --device cuda --layout multimodal \\
        --vllm-versions '>=0.26.0,<0.33' --gpu-mem 8GiB --out mtp_served_compare_cuda.json -- --max-model-len 2048

Every step is the real CLI. Build the trained tiny reference (`qwenquant.testbed.tiny.reference_model`);
for each of the recipes `tiny-reference` (bf16 MTP head) and `tiny-reference-int4mtp` (the MTP head's
Linears GPTQ int4), a copy with the chosen artifact layout, the shipped tiny-reference calibration set
and, with --vllm-versions, the vLLM range the artifact's check accepts; `qwenquant quantize` (kept when
its manifest is there: a re-run resumes); then `qwenquant eval served --serve ART --profile single-user
--json`, one artifact at a time (vLLM counts another process's GPU allocations as its own while it
profiles: docs/known-issues.md#one-vllm-start-at-a-time). `eval --serve` starts the server through
`qwenquant serve`'s preflight and supervisor, runs the recipe's exact-match gate greedily and reads MTP
acceptance from vLLM's /metrics counters, then stops the server.

Prints a table (drafts, mean acceptance length, acceptance at each draft position) and the goal of
the int4 head (mean acceptance length within 3% of the bf16 head's) and writes JSON. Flags printed as
"look first" (a measurement too good to believe): the int4 head above the bf16 head by more than 3
points at a position, or the same counts at every position (the drafter may have been built from the
wrong tensors, or both runs served one folder). Exit 0 when both arms were measured (met or not),
3 when a step failed.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from qwenquant.errors import UsageError
from qwenquant.evaluate.report import parse_report

REPO = Path(__file__).resolve().parents[1]
ARMS = (("bf16 MTP head", "tiny-reference"), ("int4 MTP head", "tiny-reference-int4mtp"))
GOAL_MAL = 0.03  # mean acceptance length of the int4 head within 3% of the bf16 head's
TOO_GOOD_POINTS = 0.03


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1 :]
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", type=Path, required=True, help="source, recipes, artifacts and logs go here")
    p.add_argument("--out", type=Path, required=True, help="the JSON report")
    p.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default=None,
        help="quantize and serve on this device (default: each command's own default)",
    )
    p.add_argument(
        "--layout",
        choices=("text-only", "multimodal"),
        default=None,
        help="the artifacts' layout (default: the recipes'; CUDA vLLM 0.26 serves multimodal)",
    )
    p.add_argument(
        "--vllm-versions", default=None, help="the vLLM range written into both recipes (default: the recipes' own)"
    )
    p.add_argument(
        "--vllm",
        type=Path,
        default=REPO / ".venv-vllm" / "qwenquant-vllm.json",
        help="the vLLM launcher (scripts/install-vllm.sh writes it)",
    )
    p.add_argument("--gpu-mem", default=None, help="passed to eval --serve (e.g. 8GiB)")
    p.add_argument("--timeout", type=int, default=1800, help="seconds for each command")
    return p.parse_args(argv), extra


def qq(args: list[str], log: Path, timeout: int) -> subprocess.CompletedProcess:
    """`python -m qwenquant ARGS` from the repository root, stderr to `log`, stdout returned."""
    print("$ qwenquant " + shlex.join(args), file=sys.stderr, flush=True)
    return run_logged([sys.executable, "-m", "qwenquant", *args], log, timeout)


def run_logged(cmd: list[str], log: Path, timeout: int, grace: int = 60) -> subprocess.CompletedProcess:
    """`cmd` from the repository root, stderr to `log`, stdout returned. Past `timeout` seconds it gets
    SIGTERM (qwenquant stops the server it started), SIGKILL `grace` seconds later; returncode 124 and
    a last line in `log` saying so."""
    with open(log, "w") as f:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=f, text=True, cwd=REPO)
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.terminate()
            try:
                out, _ = p.communicate(timeout=grace)
            except subprocess.TimeoutExpired:
                p.kill()
                out, _ = p.communicate()
            f.write(f"\n[mtp_served_compare] stopped after {timeout} s (--timeout)\n")
            return subprocess.CompletedProcess(cmd, 124, out, None)
        return subprocess.CompletedProcess(cmd, p.returncode, out, None)


def failed(step: str, r: subprocess.CompletedProcess, log: Path) -> str:
    if r.returncode == 124:
        return f"{step} stopped at the --timeout; see {log}"
    return f"{step} exited {r.returncode}; see {log}"


def write_recipe(name: str, folder: Path, layout: str | None, vllm_versions: str | None) -> Path:
    import yaml

    from qwenquant import data_path

    d = yaml.safe_load(data_path("recipes", f"{name}.yaml").read_text())
    if layout:
        d["artifact"]["layout"] = layout
    if vllm_versions:
        d["serve"]["vllm_versions"] = [vllm_versions]
    d["calibration"]["path"] = str(data_path("calibration", "tiny-reference.jsonl"))
    out = folder / f"{name}.yaml"
    out.write_text(yaml.safe_dump(d, sort_keys=False))
    return out


def measure(a: argparse.Namespace, extra: list[str]) -> dict[str, Any]:
    from qwenquant.testbed.tiny.reference_model import build_reference_checkpoint

    a.work.mkdir(parents=True, exist_ok=True)
    source = build_reference_checkpoint(a.work / "source")
    dev = ["--device", a.device] if a.device else []
    out: dict[str, Any] = {
        "schema_version": 1,
        "device": a.device,
        "layout": a.layout,
        "vllm_versions": a.vllm_versions,
        "vllm_flags": extra,
        "arms": {},
    }
    for label, recipe in ARMS:
        art = a.work / recipe
        arm: dict[str, Any] = {"recipe": recipe, "artifact": str(art)}
        out["arms"][label] = arm
        if not (art / "qwenquant-manifest.json").is_file():
            log = a.work / f"quantize-{recipe}.log"
            r = qq(
                [
                    "quantize",
                    str(source),
                    "--source-unverified",
                    "--recipe",
                    str(write_recipe(recipe, a.work, a.layout, a.vllm_versions)),
                    "--out",
                    str(art),
                    *dev,
                ],
                log,
                a.timeout,
            )
            if r.returncode != 0:
                arm["error"] = failed("quantize", r, log)
                continue
        arm["root_digest"] = json.loads((art / "qwenquant-manifest.json").read_text()).get("root_digest")
        serve = [
            "eval",
            "served",
            "--serve",
            str(art),
            "--profile",
            "single-user",
            "--vllm",
            str(a.vllm),
            "--json",
            *dev,
        ]
        if a.gpu_mem:
            serve += ["--gpu-mem", a.gpu_mem]
        log = a.work / f"served-{recipe}.log"
        r = qq([*serve, "--", *extra] if extra else serve, log, a.timeout)
        arm["eval_exit"] = r.returncode
        try:
            arm["served"] = parse_report(r.stdout, "eval served --serve --json").to_json()
        except UsageError:
            arm["error"] = failed("eval --serve", r, log) + " (no report)"
    out["comparison"] = compare(out["arms"])
    return out


def compare(arms: dict[str, Any]) -> dict[str, Any] | None:
    """The int4 head against the bf16 head: ratio of mean acceptance lengths, points per position,
    the goal and the too-good flags."""
    try:
        b, q = (arms[label]["served"]["mtp"] for label, _ in ARMS)
    except (KeyError, TypeError):
        return None
    if not b.get("drafts") or not q.get("drafts"):
        return {"error": "no drafts counted in an arm (MTP off, or /metrics without the counters)"}
    ratio = q["mean_acceptance_length"] / b["mean_acceptance_length"]
    points = {p: (q["per_position"].get(p) or 0.0) - (v or 0.0) for p, v in b["per_position"].items()}
    look = []
    if any(d > TOO_GOOD_POINTS for d in points.values()):
        look.append("the int4 head above the bf16 head by more than 3 points at a position")
    same = (b["drafts"], b["accepted_tokens"], b["per_position"]) == (
        q["drafts"],
        q["accepted_tokens"],
        q["per_position"],
    )
    if same:
        look.append("the same counts at every position")
    digests = [arms[label].get("root_digest") for label, _ in ARMS]
    if digests[0] and digests[0] == digests[1]:
        look.append("both arms served artifacts with one root digest")
    return {
        "mean_acceptance_length_ratio": ratio,
        "points_per_position": points,
        "goal": f"within {GOAL_MAL:.0%} of the bf16 head's mean acceptance length",
        "met": abs(ratio - 1) <= GOAL_MAL,
        "look_first": look,
    }


def table(r: dict[str, Any]) -> str:
    positions = sorted(
        {p for arm in r["arms"].values() for p in ((arm.get("served") or {}).get("mtp") or {}).get("per_position", {})},
        key=int,
    )
    rows = [
        "| served | drafts | mean acceptance length | " + " | ".join(f"position {p}" for p in positions) + " |",
        "|---|---|---|" + "---|" * len(positions),
    ]
    for label, arm in r["arms"].items():
        m = (arm.get("served") or {}).get("mtp") or {}
        if not m:
            rows.append(f"| {label} | {arm.get('error', 'no MTP figures')} |")
            continue
        cells = [f"{100 * v:.1f}%" if (v := m["per_position"].get(p)) is not None else "n/a" for p in positions]
        rows.append(f"| {label} | {m['drafts']} | {m['mean_acceptance_length']:.3f} | " + " | ".join(cells) + " |")
    c = r.get("comparison")
    if c and "met" in c:
        rows.append(
            f"\nint4 / bf16 mean acceptance length {c['mean_acceptance_length_ratio']:.4f} "
            f"({c['goal']}: {'met' if c['met'] else 'NOT met'}); points per position: "
            + ", ".join(f"{p}: {100 * d:+.1f}" for p, d in c["points_per_position"].items())
        )
        for line in c["look_first"]:
            rows.append(f"LOOK FIRST (too good to believe): {line}")
    elif c:
        rows.append(f"\n{c['error']}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    a, extra = parse_args(argv)
    os.environ.setdefault("QWENQUANT_NO_PROGRESS", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache for the CPU build (CUDA ignores it)
    r = measure(a, extra)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(r, indent=2, sort_keys=True) + "\n")
    print(table(r))
    print(f"wrote {a.out}", file=sys.stderr)
    return 0 if r["comparison"] and "met" in r["comparison"] else 3


if __name__ == "__main__":
    sys.exit(main())
