"""Does the offline int8-activation arm track what vLLM serves? The tiny reference, token by token.

    python -m benchmarks.int8_agreement ARTIFACT --reference SRC --vllm LAUNCHER [--device cuda]
        [--settings bf16,int8] [--mlp-humming] [--windows 16] [--window-len 256]
        [--out benchmarks/results/int8_agreement.json] [-- vLLM flags]

ARTIFACT is a `qwenquant quantize` artifact of the trained tiny reference (SRC: its source checkpoint,
`qwenquant.testbed.tiny.reference_model.build_reference_checkpoint`). The held-out windows are the ones
`qwenquant eval offline` reads (`evaluate.texts.resolve_windows`).

Offline (in this process, on --device), per-token log-probabilities of every window's next tokens for:
  bf16      the artifact dequantized, bf16-activation arithmetic (eval offline's `artifact` arm)
  int8      every int4 Linear run as vLLM's int8-activation Marlin path (eval offline's
            `artifact+int8-act` arm, evaluate/int8act.py): per-token int8 inputs, int16 group scales
  mlp-int8  only the decoder MLP Linears so (the MLP-only experiment below), the rest as bf16
Served, one server at a time, each window sent once as a token-id prompt to /v1/completions with
`prompt_logprobs: 1` (the log-probability of each prompt token and the server's top-1 token):
  bf16, int8  `qwenquant serve ARTIFACT --profile single-user --activations S`; with --force-marlin (the
            default) both run with VLLM_DISABLED_KERNELS=MacheteLinearKernel,HummingLinearKernel, so on
            SM 9.x the bf16 server runs the kernel the int8 one must run. Against each server `qwenquant
            eval served URL --json` also runs the gate and reads MTP acceptance.
  mlp-int8  (--mlp-humming) a copy of the artifact whose MLP Linears carry a second quantization group
            with int8 dynamic per-token inputs (docs/known-issues.md#int8-activations-mlp-only, variant A),
            served by vLLM directly with `--linear-backend humming` (qwenquant serve refuses the changed
            config: it is not the artifact the manifest seals); the command is `serve --dry-run`'s for the
            artifact with only the model folder swapped and the flag added. Every int4 layer then runs on
            Humming (the W4A16 ones with bf16 inputs), so its shift against the Marlin bf16 server holds the
            kernel change too. vLLM 0.26 on SM 9.0 maps that group to W4A8Fp8 (fp8 inputs, not int8); the
            run says so.

Printed and written (JSON): per setting the served and the offline perplexity over the same tokens,
the per-token |served - offline| log-prob difference (mean, p99, max) and top-1 agreement; and the
int8 effect both ways: served int8 vs served bf16 against offline int8 vs offline bf16 (perplexity
change, and the correlation of the per-token shifts). vLLM's log says which kernel each scheme got.

Every figure is checked against a second count, and a disagreement is printed, not smoothed:
  - the server's own prompt token count (usage.prompt_tokens) against the tokens sent;
  - served int8 identical to served bf16 on every token: the int8 path did not run (or both servers
    served one folder);
  - a setting whose vLLM log names another kernel than the one the setting needs (Marlin for int8;
    Humming for the MLP group of mlp-int8).

Expected (written before the run; one NVIDIA H200, CUDA vLLM 0.26.0, the trained tiny reference): the
bf16 server within 0.01-0.03 nats per token of the offline bf16 arm on average (bf16 kernels against
float32 arithmetic: the offline arm is the noise floor's other side), top-1 agreement above 98%; the int8
server as close to the offline int8 arm as bf16 is to bf16 (within 1.5x its mean difference); served and
offline int8 perplexity changes of the same sign and within 0.3 points of each other (offline, on CPU:
-0.02%); per-token shift correlation 0.3-0.9 (the int8 shifts are small against the bf16 noise).
Too good to believe: any served setting bit-identical to another, or a served/offline mean difference
under 1e-4 nats (the server would not be computing in bf16).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from qwenquant.errors import UsageError
from qwenquant.evaluate.report import ServedReport, parse_report

from benchmarks.serving import (
    REPO,
    cli_env,
    kernels_of,
    marlin_only,
    qwenquant_cli,
    served_model,
    serving,
    stop,
    wait_ready,
)

MLP_TARGET = r"re:.*layers\.\d+\.mlp\.(gate_proj|up_proj|down_proj)$"
# vLLM's scheme for a 4-bit-weight group with 8-bit dynamic per-token inputs, and what its inputs become: 0.26
# sends it to W4A8Fp8 on SM 9.0 exactly (`_is_fp8_w4a8_sm90` reads bits, strategy and symmetry, not the type)
MLP_SCHEMES = {"CompressedTensorsWNA8Int": "int8", "CompressedTensorsW4A8Fp8": "fp8 (e4m3)"}
INT8_TOKEN = {"num_bits": 8, "type": "int", "strategy": "token", "dynamic": True, "symmetric": True}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------- offline
def offline_arms(reference: Path, artifact: Path, ids: Any, device: str, mlp: bool) -> dict[str, dict[str, Any]]:
    """{arm: {"lp": [N, L-1] log-probs of the next tokens, "top1": [N, L-1] argmax, "int8_linears"}} for the
    offline arms; `int8` is eval offline's own arm (offline.int8_dense_arm)."""
    import torch

    from qwenquant.evaluate.forward import DenseForward
    from qwenquant.evaluate.int8act import int8_modules, swap_linears
    from qwenquant.evaluate.offline import int8_dense_arm
    from qwenquant.evaluate.weights import dequantize, raw_tensors, read_config, text_config

    config, raw = read_config(artifact), raw_tensors(artifact)
    tensors = dequantize(raw, config)
    head = tensors["lm_head.weight"].float().to(device)
    plain = lambda h: h @ head.T
    arms: dict[str, tuple[Any, Any, int]] = {"bf16": (DenseForward(text_config(config), tensors, device), plain, 0)}
    (fwd, lm), _, counts = int8_dense_arm(raw, config, tensors, head, device)
    arms["int8"] = (fwd, lm, counts["body"] + counts["lm_head"])  # the MTP head plays no part in the log-probs
    if mlp:
        fwd = DenseForward(text_config(config), tensors, device)
        mods = {n: m for n, m in int8_modules(raw, config).items() if ".mlp." in n and not n.startswith("mtp.")}
        arms["mlp-int8"] = (fwd, plain, len(swap_linears(fwd.model, mods)))
    out: dict[str, dict[str, Any]] = {}
    for arm, (fwd, lm, n_int8) in arms.items():
        lps, tops = [], []
        with torch.no_grad():
            for i in range(ids.shape[0]):
                w = ids[i : i + 1]
                logits = lm(fwd.final_hidden(w))[0, :-1].float()
                lp = torch.log_softmax(logits, dim=-1)
                lps.append(lp.gather(-1, w[0, 1:].to(lp.device)[:, None])[:, 0].cpu())
                tops.append(logits.argmax(-1).cpu())
        out[arm] = {"lp": torch.stack(lps), "top1": torch.stack(tops), "int8_linears": n_int8}
        log(f"offline {arm}: {n_int8} Linears with int8 inputs")
    return out


# ---------------------------------------------------------------------------------------------- served
def served_logprobs(base: str, model: str, ids: Any) -> dict[str, Any]:
    """{"lp": [N, L-1], "top1": [N, L-1], "prompt_tokens": [N] (the server's count), "drafting": whether the server
    drafts (MTP on: its prompt_logprobs are suspect, vllm #53488; `checks` flags it)} from prompt_logprobs."""
    import torch

    from qwenquant.evaluate.speccheck import drafts
    from qwenquant.net.http import post_json

    lps, tops, counted = [], [], []
    for i in range(ids.shape[0]):
        toks = [int(t) for t in ids[i]]
        r = post_json(
            f"{base}/v1/completions",
            {"model": model, "prompt": toks, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 1},
            timeout=300,
        )
        plp = r["choices"][0]["prompt_logprobs"]
        counted.append(int((r.get("usage") or {}).get("prompt_tokens", -1)))
        lp, top = [], []
        for pos, entry in zip(range(1, len(toks)), plp[1:], strict=True):
            lp.append(float(entry[str(toks[pos])]["logprob"]))
            best = min(entry.items(), key=lambda kv: kv[1].get("rank", 10**9))
            top.append(int(best[0]))
        lps.append(torch.tensor(lp))
        tops.append(torch.tensor(top))
    return {
        "lp": torch.stack(lps),
        "top1": torch.stack(tops),
        "prompt_tokens": counted,
        "drafting": bool(drafts(base, None)),
    }


def serve_setting(a: argparse.Namespace, setting: str, ids: Any, port: int) -> dict[str, Any]:
    """One `qwenquant serve --activations SETTING`: its prompt log-probs, eval served's gate and MTP figures."""
    log_file = a.out.with_name(f"{a.out.stem}-{setting}.vllm.log")
    cmd = [
        sys.executable,
        "-m",
        "qwenquant",
        "serve",
        str(a.artifact),
        "--profile",
        "single-user",
        "--activations",
        setting,
        "--port",
        str(port),
        "--log-file",
        str(log_file),
        "--timeout",
        str(a.timeout),
    ]
    cmd += (["--vllm", a.vllm] if a.vllm else []) + (["--", *a.extra] if a.extra else [])
    env = marlin_only(cli_env()) if a.force_marlin else cli_env()
    out: dict[str, Any] = {"command": cmd, "log": str(log_file)}
    with serving(cmd, env, out) as url:
        if url is not None:
            base = url.rstrip("/")
            log(f"{setting}: ready after {out['ready_s']:.1f} s at {base}")
            out["served"] = served_logprobs(base, served_model(base), ids)
            r = qwenquant_cli("eval", "served", base, "--json", env=env, timeout=900)
            try:
                rep = parse_report(r.stdout, "eval served --json")
                if not isinstance(rep, ServedReport):
                    raise ValueError(f"eval served --json printed a report of kind {rep.kind}")
                out["eval_served"] = {
                    "exit": r.returncode,
                    "cases_passed": sum(t.passed for t in rep.tasks),
                    "cases": sum(t.total for t in rep.tasks),
                    "mtp": rep.mtp.to_json(),
                    "failures": rep.failures,
                }
            except (ValueError, UsageError) as e:
                out["eval_served"] = {
                    "exit": r.returncode,
                    "error": f"{type(e).__name__}: {e}",
                    "stderr": r.stderr[-800:],
                }
    out["kernels"] = kernels_of(log_file)
    return out


def mlp_variant(artifact: Path, dst: Path) -> Path:
    """A copy of `artifact` whose decoder MLP Linears carry a second group with int8 dynamic per-token inputs."""
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(artifact, dst)
    p = dst / "config.json"
    cfg = json.loads(p.read_text())
    qc = cfg["quantization_config"]
    g = copy.deepcopy(qc["config_groups"]["group_0"])
    g["targets"] = [MLP_TARGET]
    g["input_activations"] = dict(INT8_TOKEN)
    qc["config_groups"] = {"group_mlp_w4a8": g, **qc["config_groups"]}
    p.write_text(json.dumps(cfg, indent=2) + "\n")
    return dst


def serve_humming(a: argparse.Namespace, ids: Any, port: int) -> dict[str, Any]:
    """The MLP-int8 variant served by vLLM directly with --linear-backend humming."""
    from qwenquant.errors import QwenquantError

    variant = mlp_variant(a.artifact, a.out.with_name(f"{a.out.stem}-mlp-int8-artifact"))
    argv = ["serve", str(a.artifact), "--profile", "single-user", "--port", str(port), "--dry-run", "--json"]
    argv += (["--vllm", a.vllm] if a.vllm else []) + (["--", *a.extra] if a.extra else [])
    r = qwenquant_cli(*argv, env=cli_env(), timeout=300)
    if r.returncode != 0:
        return {"error": f"serve --dry-run exited {r.returncode}: {r.stderr.strip()[-400:]}"}
    plan = json.loads(r.stdout)
    cmd = list(plan["command"])
    cmd[cmd.index("--model") + 1] = str(variant)
    cmd += ["--linear-backend", "humming"]
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in plan.get("env_unset", []) and k not in ("VLLM_DISABLED_KERNELS", "VLLM_MARLIN_INPUT_DTYPE")
    }  # humming: neither may stay
    env.update(plan.get("env") or {})
    log_file = a.out.with_name(f"{a.out.stem}-mlp-int8.vllm.log")
    out: dict[str, Any] = {"command": cmd, "log": str(log_file), "artifact": str(variant)}
    base = f"http://127.0.0.1:{port}"
    t0 = time.monotonic()
    with open(log_file, "w") as fh:
        p = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            model = wait_ready(base, p, a.timeout)
            out["ready_s"] = round(time.monotonic() - t0, 1)
            log(f"mlp-int8 (humming): ready after {out['ready_s']} s")
            out["served"] = served_logprobs(base, model, ids)
        except (RuntimeError, OSError, QwenquantError) as e:
            out["error"] = str(e)
        finally:
            out["serve_exit"] = stop(p)
    out["kernels"] = kernels_of(log_file)
    if "error" in out:
        out["log_tail"] = log_file.read_text(errors="replace")[-3000:]
    return out


# ---------------------------------------------------------------------------------------------- compare
def agreement(served: dict[str, Any], offline: dict[str, Any]) -> dict[str, Any]:
    """Served against offline on the same tokens (pure over the tensors)."""
    d = (served["lp"] - offline["lp"]).abs().flatten().double()
    return {
        "served_ppl": math.exp(-float(served["lp"].double().mean())),
        "offline_ppl": math.exp(-float(offline["lp"].double().mean())),
        "abs_diff_mean": float(d.mean()),
        "abs_diff_p99": float(d.quantile(0.99)),
        "abs_diff_max": float(d.max()),
        "top1_agree": float((served["top1"] == offline["top1"]).double().mean()),
    }


def shift(a_lp: Any, b_lp: Any) -> dict[str, Any]:
    """What moving from lp `a` to lp `b` does: perplexity change (ppl_b/ppl_a - 1) and the per-token shifts."""
    s = (b_lp - a_lp).double().flatten()
    return {"ppl_change": math.exp(-float(s.mean())) - 1, "shift": s}


def effect(served: dict[str, dict[str, Any]], offline: dict[str, dict[str, Any]], arm: str) -> dict[str, Any] | None:
    """The `arm` setting against bf16, served and offline: both perplexity changes, the shifts' correlation."""
    import torch

    if arm not in served or "bf16" not in served or arm not in offline:
        return None
    sv, of = shift(served["bf16"]["lp"], served[arm]["lp"]), shift(offline["bf16"]["lp"], offline[arm]["lp"])
    corr = float(torch.corrcoef(torch.stack([sv["shift"], of["shift"]]))[0, 1]) if sv["shift"].std() > 0 else None
    return {
        "served_ppl_change": sv["ppl_change"],
        "offline_ppl_change": of["ppl_change"],
        "shift_corr": corr,
        "served_tokens_changed": float((sv["shift"] != 0).double().mean()),
        "served_top1_same": float((served["bf16"]["top1"] == served[arm]["top1"]).double().mean()),
        "offline_top1_same": float((offline["bf16"]["top1"] == offline[arm]["top1"]).double().mean()),
    }


def mlp_scheme_flags(kernels: dict[str, str]) -> list[str]:
    """What vLLM's log says of the MLP group of the mlp-int8 variant (pure): it must have a scheme with 8-bit
    inputs, on Humming; vLLM 0.26 on SM 9.0 maps it to W4A8Fp8, whose inputs are fp8, not int8."""
    found = {s: k for s, k in kernels.items() if s in MLP_SCHEMES}
    if not found:
        return [
            "mlp-int8: no 8-bit-input scheme in vLLM's log: the MLP group was served as W4A16 (its int8 input dropped)"
        ]
    out = []
    for scheme, kernel in sorted(found.items()):
        if kernel != "HummingLinearKernel":
            out.append(f"mlp-int8: {scheme} ran on {kernel}, not Humming")
        if MLP_SCHEMES[scheme] != "int8":
            out.append(
                f"mlp-int8: vLLM mapped the MLP group to {scheme}: its inputs are {MLP_SCHEMES[scheme]}, not int8, "
                "so the offline int8 arm does not model this server"
            )
    return out


def checks(settings: dict[str, dict[str, Any]], ids: Any) -> list[str]:
    """The disagreements: every one printed."""
    flags = []
    n = int(ids.shape[1])
    for name, s in settings.items():
        got = s.get("served")
        if got is None:
            flags.append(f"{name}: no served figures ({s.get('error', 'no server')})")
            continue
        if got.get("drafting"):
            flags.append(
                f"{name}: prompt log-probs read from a server that drafts (MTP on): vllm #53488 returns wrong "
                "prompt_logprobs for some requests there; serve it with -- --speculative-config null"
            )
        bad = [c for c in got["prompt_tokens"] if c != n]
        if bad:
            flags.append(f"{name}: the server counted {bad[0]} prompt tokens where {n} were sent ({len(bad)} windows)")
        k = s.get("kernels") or {}
        if name == "int8" and k.get("CompressedTensorsWNA16") != "MarlinLinearKernel":
            flags.append(
                f"int8: W4A16 layers ran on {k.get('CompressedTensorsWNA16')}, not Marlin: no int8 activations"
            )
        if name == "mlp-int8":
            flags += mlp_scheme_flags(k)
    names = [n for n in settings if settings[n].get("served") is not None]
    for i, x in enumerate(names):
        for y in names[i + 1 :]:
            if bool((settings[x]["served"]["lp"] == settings[y]["served"]["lp"]).all()):
                flags.append(
                    f"{x} and {y} served bit-identical log-probs: the int8 path did not run, or one folder served both"
                )
    return flags


def table(rows: dict[str, Any], effects: dict[str, Any]) -> str:
    lines = [
        f"{'setting':<10}{'served ppl':>12}{'offline ppl':>13}{'|d| mean':>10}{'|d| p99':>10}{'|d| max':>10}{'top1':>8}"
    ]
    for name, r in rows.items():
        lines.append(
            f"{name:<10}{r['served_ppl']:>12.3f}{r['offline_ppl']:>13.3f}{r['abs_diff_mean']:>10.4f}"
            f"{r['abs_diff_p99']:>10.4f}{r['abs_diff_max']:>10.4f}{r['top1_agree']:>8.2%}"
        )
    for name, e in effects.items():
        if e:
            corr = "-" if e["shift_corr"] is None else f"{e['shift_corr']:.2f}"
            lines.append(
                f"{name} vs bf16: served ppl {e['served_ppl_change']:+.3%}, offline {e['offline_ppl_change']:+.3%}; "
                f"per-token shift correlation {corr}; served tokens changed {e['served_tokens_changed']:.1%}; "
                f"top-1 unchanged served {e['served_top1_same']:.2%} / offline {e['offline_top1_same']:.2%}"
            )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("artifact", type=Path)
    ap.add_argument("--reference", type=Path, required=True, help="the artifact's source checkpoint (tiny reference)")
    ap.add_argument("--vllm", help="qwenquant-vllm.json, a python or a vllm executable (default: serve's search)")
    ap.add_argument("--device", default="cpu", help="where the offline arms run")
    ap.add_argument("--settings", default="bf16,int8")
    ap.add_argument(
        "--mlp-humming", action="store_true", help="also the MLP-only int8 variant on --linear-backend humming"
    )
    ap.add_argument("--force-marlin", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--windows", type=int, default=16)
    ap.add_argument("--window-len", type=int, default=256)
    ap.add_argument("--port", type=int, default=8170)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks/results/int8_agreement.json")
    extra: list[str] = []
    if "--" in argv:
        argv, extra = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    a = ap.parse_args(argv)
    a.extra, a.artifact = extra, a.artifact.resolve()
    a.out = a.out.resolve()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    print("Expected" + __doc__.split("Expected", 1)[1].rstrip(), file=sys.stderr)
    from qwenquant.evaluate.texts import resolve_windows

    ids, source = resolve_windows(a.reference, a.windows, a.window_len)
    t0 = time.monotonic()
    offline = offline_arms(a.reference, a.artifact, ids, a.device, a.mlp_humming)
    log(f"offline arms: {time.monotonic() - t0:.1f} s")
    settings: dict[str, dict[str, Any]] = {}
    for i, s in enumerate(a.settings.split(",")):
        settings[s] = serve_setting(a, s, ids, a.port + i)
    if a.mlp_humming:
        settings["mlp-int8"] = serve_humming(a, ids, a.port + 9)
    rows = {n: agreement(s["served"], offline[n]) for n, s in settings.items() if s.get("served") and n in offline}
    effects = {
        n: effect({k: v["served"] for k, v in settings.items() if v.get("served")}, offline, n)
        for n in settings
        if n != "bf16"
    }
    flags = checks(settings, ids)
    print(table(rows, effects))
    for f in flags:
        print(f"DISAGREES: {f}")
    for n, s in settings.items():
        print(f"{n}: kernels {s.get('kernels') or 'not in the log'}; eval served {s.get('eval_served', '-')}")
    for s in settings.values():
        s.pop("served", None)
    report = {
        "schema_version": 1,
        "artifact": str(a.artifact),
        "reference": str(a.reference),
        "windows": a.windows,
        "window_len": a.window_len,
        "text": source.to_json(),
        "device": a.device,
        "force_marlin": a.force_marlin,
        "vllm_flags": extra,
        "date": time.strftime("%Y-%m-%d"),
        "rows": rows,
        "effects": {n: e for n, e in effects.items() if e},
        "offline_int8_linears": {n: o["int8_linears"] for n, o in offline.items()},
        "settings": settings,
        "flags": flags,
    }
    a.out.write_text(json.dumps(report, indent=2, sort_keys=True, default=str) + "\n")
    print(f"wrote {a.out}")
    return 0 if rows and not any("error" in s for s in settings.values()) else 3


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
