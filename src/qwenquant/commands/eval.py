"""`qwenquant eval`: what quantization cost (offline, against the source) and whether MTP still accepts (served)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from qwenquant.commands._app import Device, app
from qwenquant.commands._options import (
    DEFAULT_TIMEOUT,
    ApiKey,
    GpuMem,
    GpuMemSoft,
    Gpus,
    Profiles,
    ServeArtifact,
    Timeout,
    Vllm,
)

if TYPE_CHECKING:
    from qwenquant.evaluate.servedrun import ServedAsk
    from qwenquant.serve.request import ServeRequest


@app.command("eval", context_settings={"allow_interspersed_args": True})
def eval_cmd(
    args: list[str] | None = typer.Argument(None, help="ARTIFACT folder (with qwenquant-manifest.json); with --serve: vLLM flags after --.",
                                               show_default=False),
    reference: Path | None = typer.Option(None, "--reference", exists=True, file_okay=False, help="The bf16 source checkpoint folder: every file the manifest records for the source must match (sha256)."),
    reference_unverified: bool = typer.Option(False, "--reference-unverified", help="Compare against a --reference that is not the manifest's recorded source (the report and output say so)."),
    windows: int = typer.Option(32, "--windows", help="Held-out windows to evaluate on."),
    window_len: int = typer.Option(256, "--window-len", help="Tokens per window."),
    text: Path | None = typer.Option(None, "--text", help="Local text file to cut windows from."),
    text_set: str | None = typer.Option(None, "--text-set", help="Pinned Hub text set (evaltext/NAME.yaml or a YAML path), fetched verified and cached. Default: the tiny reference's held-out text for it, wikitext-2-test for other models."),
    streamed: bool | None = typer.Option(None, "--streamed/--dense", help="Run both arms one decoder layer at a time from the shards (default: streamed above 2 GB of weights)."),
    device: Device | None = typer.Option(None, "--device", help="cpu or cuda (offline default: cpu; with --serve: as for `qwenquant serve`)."),
    report: Path | None = typer.Option(None, "--report", help="Where the JSON report goes (default: beside the artifact)."),
    served: str | None = typer.Option(None, "--served", help="Base URL of a running server: run the exact-match gate through it."),
    serve: ServeArtifact = None,
    profile: Profiles = None,
    gpu_mem: GpuMem = None,
    gpu_mem_soft: GpuMemSoft = False,
    gpus: Gpus = 1,
    vllm: Vllm = None,
    timeout: Timeout = DEFAULT_TIMEOUT,
    api_key: ApiKey = None,
    gate: str = typer.Option("tiny-reference", "--gate", help="Gate name (shipped) or JSON file, with --served/--serve."),
    model: str | None = typer.Option(None, "--model", help="Served model name (default: the server's first)."),
    min_acceptance: float | None = typer.Option(None, "--min-acceptance-length", help="Fail when MTP mean acceptance length is below this (with --served/--serve)."),
    tools: bool = typer.Option(False, "--tools", help="Also send the shipped tool schemas (with --served/--serve): each answer must be a well-formed tool call whose arguments match the schema, or a plain answer."),
    needle: bool = typer.Option(False, "--needle", help="Also run the shipped needle task (with --served/--serve): a fact planted at several depths of prompts up to the server's max_model_len; pass/fail per depth."),
    needle_max_len: int | None = typer.Option(None, "--needle-max-len", help="Longest needle prompt in tokens (default: the server's max_model_len)."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON on stdout."),
    list_gates: bool = typer.Option(False, "--list-gates", help="List the shipped gates (name, tasks, what they are for) and exit."),
) -> None:
    """Measure an artifact against its source: paired perplexity, KL, top-1, lm_head and MTP figures.

    Offline, both models run one torch forward over dequantized weights on the same held-out windows.

    With --served URL (a running server) or --serve ARTIFACT (started through `qwenquant serve`'s own preflight and supervisor, stopped afterwards), run a gate of exact-match tasks through the OpenAI API (`--gate none`: no such tasks) and read MTP acceptance from the server's /metrics counters; --tools adds the tool-calling gate, --needle retrieval at depth. A failed task, a low acceptance, a malformed tool call or a missed needle exits 8.

    Examples:

      qwenquant eval artifacts/tiny --reference models/tiny-reference

      qwenquant eval --served http://127.0.0.1:8000 --min-acceptance-length 1.2 --json

      qwenquant eval --serve artifacts/q27b --profile single-user --gpu-mem 24GiB --min-acceptance-length 1.5

      qwenquant eval --served http://127.0.0.1:8000 --gate none --tools --needle

    (--needle asks a question in chat: run it on an instruction-following model; the demo's tiny model misses every depth and the run says so.)
    """
    from qwenquant.errors import UsageError
    from qwenquant.evaluate.servedrun import ServedAsk

    if list_gates:
        _list_gates(as_json)
        return
    words = list(args or [])
    dev = device.value if device else None
    if served is not None and serve is not None:
        raise UsageError("give --served URL or --serve ARTIFACT, not both", hint="--served for a running server")
    gate_opts = _GateOptions(ServedAsk(gate, model, api_key, min_acceptance, tools, needle, needle_max_len), report,
                             as_json)
    if served is not None or serve is not None:
        gate_opts.check()
    if serve is not None:
        from qwenquant.serve.request import ServeRequest

        if words and not words[0].startswith("-"):
            raise UsageError(f"give an ARTIFACT ({words[0]}) or --serve ARTIFACT, not both", hint="vLLM flags go after --")
        _serve_and_gate(ServeRequest.from_options(serve, profile or [], words, gpu_mem=gpu_mem,
                                                  gpu_mem_soft=gpu_mem_soft, gpus=gpus, vllm=vllm,
                                                  device=dev, timeout=timeout, api_key=api_key), gate_opts)
        return
    if served is not None:
        from qwenquant.net.http import check_url

        check_url(served, "--served")
        if words:
            raise UsageError(f"unexpected arguments {words} with --served", hint="vLLM flags after -- go with --serve")
        _served(served, gate_opts)
        return
    if len(words) != 1 or reference is None:
        raise UsageError("eval needs ARTIFACT and --reference SOURCE (or --served URL, or --serve ARTIFACT)",
                         hint="qwenquant eval artifacts/q --reference models/source")
    _offline(Path(words[0]), reference, windows, window_len, (text, text_set), dev or "cpu", streamed, report, as_json,
             reference_unverified)


def _list_gates(as_json: bool) -> None:
    from qwenquant.console import stdout
    from qwenquant.evaluate.served import describe_gates

    gates = describe_gates()
    if as_json:
        print(json.dumps(gates, indent=2))
        return
    for g in gates:
        stdout.print(f"{g['name']}: {g['tasks']} tasks, {g['cases']} cases. {g['description']}", markup=False)


@dataclass(frozen=True)
class _GateOptions:
    """What the served gate is asked (the same with --served URL and --serve ARTIFACT)."""

    ask: ServedAsk
    report: Path | None
    as_json: bool

    def check(self) -> None:
        """Before any server is asked: the run tests something and the --report folder can be written."""
        self.ask.check()
        if self.report is not None:
            from qwenquant.evaluate.inputs import check_report_folder

            check_report_folder(self.report)


def _emit(result: dict[str, Any], path: Path | None, as_json: bool) -> str | None:
    """Write the report to `path` and print it with --json; when the write fails the measurement is
    kept (printed on stdout, and in a spare file when one can be written). Returns why it failed."""
    from qwenquant.console import console
    from qwenquant.evaluate.report import save_report

    where, failed = save_report(result, path) if path is not None else (None, None)
    if failed:
        console.print(f"report: could not write {path} ({failed}); "
                      + (f"the report went to {where} instead, and to stdout" if where else "the report is on stdout"),
                      markup=False, soft_wrap=True)
    elif path is not None:
        console.print(f"report: {path}", markup=False)
    if as_json or failed:
        print(json.dumps(result, indent=2, sort_keys=True))
    return f"report {path} could not be written ({failed})" if failed else None


def _fail_write(failed: str | None) -> None:
    from qwenquant.errors import UsageError

    if failed:
        raise UsageError(failed + ": the measurement was printed on stdout",
                         hint="free space or pass --report in a folder you can write, then run eval again")


def _offline(artifact: Path, reference: Path, windows: int, window_len: int, texts: tuple, device: str,
             streamed: bool | None, report: Path | None, as_json: bool, unverified: bool) -> None:
    from qwenquant.console import console
    from qwenquant.errors import UsageError
    from qwenquant.evaluate import report as rep
    from qwenquant.evaluate.inputs import check_reference, check_report_target, verify_artifact_first
    from qwenquant.evaluate.offline import run_offline
    from qwenquant.evaluate.texts import resolve_windows

    if not artifact.is_dir():
        raise UsageError(f"ARTIFACT {artifact}: {'is a file, not a folder' if artifact.exists() else 'folder not found'}",
                         hint="pass the artifact folder `qwenquant quantize` wrote")
    root = verify_artifact_first(artifact)
    ref_check = check_reference(artifact, reference, unverified=unverified)
    ids, source = resolve_windows(reference, windows, window_len, text=texts[0], text_set=texts[1])
    identity = {"root_digest": root, "reference": str(reference), "windows": windows, "window_len": window_len,
                **source}
    target = report or rep.report_path(artifact, root)
    check_report_target(target, identity, explicit=report is not None)
    result = run_offline(reference, artifact, ids, device=device, streamed=streamed)
    result.update(artifact=str(artifact), reference_check=ref_check, **identity)
    result["goals"] = rep.goals(result)
    console.print(rep.offline_table(result))
    for line in rep.summary_lines(result):
        console.print(line, markup=False)
    if not ref_check["verified"]:
        console.print(f"NOTE: the reference was not checked against the artifact's recorded source "
                      f"({ref_check['recorded_source']}): --reference-unverified", markup=False)
    _fail_write(_emit(result, target, as_json))


def _gate(url: str, o: _GateOptions, model: str | None) -> dict[str, Any]:
    """Run what `o` asks against `url`, print what a user reads, return the result (failures listed)."""
    from qwenquant.console import console
    from qwenquant.evaluate.servedrun import run_served

    result = run_served(url, o.ask, model)
    for t in result["tasks"]:
        console.print(f"task {t['name']}: {t['passed']}/{t['total']} passed", markup=False)
    for c in result.get("tools", {}).get("cases", []):
        console.print(f"tool case {c['name']}: {c['kind'].replace('_', ' ')}"
                      + (f" ({c['problems'][0]})" if c["problems"] else ""), markup=False)
    for r in result.get("needle", {}).get("depths", []):
        console.print(f"needle at depth {r['needle_tokens']:,} of {r['prompt_tokens']:,} tokens ({r['depth']:g}): "
                      f"{'passed' if r['passed'] else 'failed'}", markup=False)
    m = result["mtp"]
    mal = m["mean_acceptance_length"]
    if m.get("unavailable"):
        console.print(f"MTP: not measured ({m['unavailable']})", markup=False)
    else:
        console.print(f"MTP over the {' and '.join(m['over'])}: {m['drafts']} drafts, {m['accepted_tokens']}/"
                      f"{m['draft_tokens']} draft tokens accepted, mean acceptance length "
                      f"{'n/a' if mal is None else f'{mal:.3f}'}, per position "
                      + ", ".join(f"{p}: {'n/a' if v is None else f'{100 * v:.1f}%'}"
                                  for p, v in m["per_position"].items()), markup=False, soft_wrap=True)
    return result


def _fail_gate(result: dict[str, Any], failed_write: str | None) -> None:
    from qwenquant.errors import BenchError

    _fail_write(None if result["failures"] else failed_write)
    if result["failures"]:
        raise BenchError("served gate failed: " + "; ".join(result["failures"]),
                         hint="compare with the bf16 source served the same way; see `qwenquant eval ARTIFACT --reference`")


def _gate_name(o: _GateOptions) -> str | None:
    from qwenquant.evaluate.served import load_gate

    return load_gate(o.ask.gate).get("name")


def _served(url: str, o: _GateOptions) -> None:
    if o.report is not None:
        from qwenquant.evaluate.inputs import check_report_target
        from qwenquant.evaluate.served import base_url

        check_report_target(o.report, {"url": base_url(url), "gate": _gate_name(o)}, explicit=True)
    result = _gate(url, o, None)
    _fail_gate(result, _emit(result, o.report, o.as_json))


def _serve_and_gate(req: ServeRequest, o: _GateOptions) -> None:
    """Start `req.artifact` as `qwenquant serve` would, run the gate, stop the server; report keyed to its root digest."""
    from qwenquant.console import console
    from qwenquant.evaluate.inputs import check_report_target
    from qwenquant.evaluate.report import report_path
    from qwenquant.manifest import load_manifest
    from qwenquant.serve.launched import launched

    root = load_manifest(req.artifact).root_digest
    target = o.report or report_path(req.artifact, root, kind="eval-served")
    check_report_target(target, {"root_digest": root, "gate": _gate_name(o)}, explicit=o.report is not None)
    with launched(req) as s:
        console.print(f"serving {req.artifact} at {s.url} (profile {s.info['profile']}, log {s.spec.log_path})",
                      markup=False)
        result = _gate(s.url, o, o.ask.model or s.model)
        console.print("stopping the server", markup=False)
    result.update(served=s.info, root_digest=s.info["artifact_root_digest"])
    failed = _emit(result, target if result["root_digest"] == root else report_path(req.artifact, result["root_digest"],
                                                                                     kind="eval-served"), o.as_json)
    _fail_gate(result, failed)
