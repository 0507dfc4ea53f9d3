"""`qwenquant eval offline|served|gates`: what quantization cost (offline, against the source) and
whether a served model still passes its gate and accepts MTP drafts (served)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from qwenquant.commands._app import Activations, Device, app
from qwenquant.commands._eval_options import (
    AsJson,
    DraftTokens,
    Gate,
    MinAcceptance,
    Model,
    Needle,
    NeedleMaxLen,
    OfflineActs,
    OfflineDevice,
    OfflineReportPath,
    Reference,
    ReferenceUnverified,
    ReferenceUrl,
    Report,
    ServedArgs,
    SpecCheck,
    SpecTieNats,
    Streamed,
    Text,
    TextSet,
    Tools,
    WindowLen,
    Windows,
)
from qwenquant.commands._options import ServeArtifact, ServerOptions, with_options

if TYPE_CHECKING:
    from qwenquant.evaluate.report import EvalReport, OfflineReport, ServedReport
    from qwenquant.evaluate.reportparts import SpecCheck as SpecCheckResult
    from qwenquant.evaluate.servedrun import ServedAsk
    from qwenquant.evaluate.speccheck import Drafted, SpecCheckAsk
    from qwenquant.reportsink import Written
    from qwenquant.serve.request import ServeRequest

eval_app = typer.Typer(
    help=(
        "Measure an artifact: offline against its bf16 source, or served through the OpenAI API.\n\n"
        "offline: paired perplexity, KL, top-1, lm_head and MTP figures of the artifact and its source on the "
        "same held-out windows (one torch forward over dequantized weights). served: an exact-match gate, "
        "the tool-calling gate (--tools) and retrieval at depth (--needle) through a running server (URL) or "
        "one started for the run (--serve ARTIFACT), with MTP acceptance from the server's /metrics. "
        "A failed task, a low acceptance, a malformed tool call or a missed needle exits 8.\n\n"
        "Examples:\n\n"
        "  qwenquant eval offline artifacts/tiny --reference models/tiny-reference\n\n"
        "  qwenquant eval served http://127.0.0.1:8000 --min-acceptance-length 1.2 --json\n\n"
        "  qwenquant eval served --serve artifacts/q27b --profile single-user --gpu-mem 24GiB "
        "--min-acceptance-length 1.5\n\n"
        "  qwenquant eval served http://127.0.0.1:8000 --gate none --tools --needle\n\n"
        "  qwenquant eval gates"
    ),
    no_args_is_help=True,
)
app.add_typer(eval_app, name="eval")


@eval_app.command("offline")
def offline(
    artifact: Annotated[
        Path, typer.Argument(help="ARTIFACT folder (with qwenquant-manifest.json).", show_default=False)
    ],
    reference: Reference,
    reference_unverified: ReferenceUnverified = False,
    windows: Windows = 32,
    window_len: WindowLen = 256,
    text: Text = None,
    text_set: TextSet = None,
    streamed: Streamed = None,
    device: OfflineDevice = Device.cpu,
    activations: OfflineActs = Activations.bf16,
    report: OfflineReportPath = None,
    as_json: AsJson = False,
) -> None:
    """The artifact against its source on the same held-out windows: paired perplexity, KL, top-1, lm_head and MTP.

    Before it measures: the artifact verifies (exit 4), --reference is the source its manifest records (exit 4), both have the same sizes and the report path can be written (exit 2).

    Examples:

      qwenquant eval offline artifacts/tiny --reference models/tiny-reference

      qwenquant eval offline artifacts/q27b --reference models/Qwen3.8-27B --device cuda --report q27b-eval.json

      qwenquant eval offline artifacts/tiny --reference models/tiny-reference --activations int8
    """
    from qwenquant.evaluate.offlinerun import OfflineAsk, run_offline_eval
    from qwenquant.reportsink import json_on_failure

    ask = OfflineAsk(
        artifact,
        reference,
        windows,
        window_len,
        text,
        text_set,
        device.value,
        streamed,
        report,
        reference_unverified,
        activations.value,
    )
    with json_on_failure(as_json, {"kind": "offline"}):  # --json: one JSON document, the error's too
        result, target = run_offline_eval(ask)
        _show_offline(result)
        _fail_write(_emit(result, target, as_json))


def _show_offline(result: OfflineReport) -> None:
    """The offline table and its summary lines (stderr), and a note when the reference was not verified."""
    from qwenquant.console import console
    from qwenquant.evaluate import report as rep

    console.print(rep.offline_table(result))
    for line in rep.summary_lines(result):
        console.print(line, markup=False)
    if not result.reference_check.verified:
        console.print(
            f"NOTE: the reference was not checked against the artifact's recorded source "
            f"({result.reference_check.recorded_source}): --reference-unverified",
            markup=False,
        )


@eval_app.command("served", context_settings={"allow_interspersed_args": True})
@with_options("server", ServerOptions)
def served(
    args: ServedArgs = None,
    serve: ServeArtifact = None,
    *,
    server: ServerOptions,
    gate: Gate = "tiny-reference",
    model: Model = None,
    min_acceptance: MinAcceptance = None,
    tools: Tools = False,
    needle: Needle = False,
    needle_max_len: NeedleMaxLen = None,
    report: Report = None,
    as_json: AsJson = False,
    spec_check: SpecCheck = False,
    reference_url: ReferenceUrl = None,
    draft_tokens: DraftTokens = None,
    spec_tie_nats: SpecTieNats = 0.1,
) -> None:
    """A gate of exact-match tasks (and --tools, --needle) through the OpenAI API, MTP acceptance from /metrics.

    Give the URL of a running server, or --serve ARTIFACT to start one through `qwenquant serve`'s own preflight and supervisor for the run (stopped afterwards; vLLM flags after --). `--gate none` runs only --tools and --needle; a run that tests nothing is refused (exit 2). A failed task, a low acceptance, a malformed tool call or a missed needle exits 8.

    Examples:

      qwenquant eval served http://127.0.0.1:8000 --min-acceptance-length 1.2 --json

      qwenquant eval served --serve artifacts/q27b --profile single-user --gpu-mem 24GiB --min-acceptance-length 1.5

      qwenquant eval served http://127.0.0.1:8000 --gate none --tools --needle

    (--needle asks a question in chat: run it on an instruction-following model; the demo's tiny model misses every depth and the run says so.)
    """
    from qwenquant.errors import UsageError
    from qwenquant.evaluate.servedrun import ServedAsk
    from qwenquant.evaluate.speccheck import SpecCheckAsk, check_reference
    from qwenquant.reportsink import json_on_failure

    words = list(args or [])
    ask = ServedAsk(gate, model, server.api_key, min_acceptance, tools, needle, needle_max_len)
    spec = SpecCheckAsk(reference_url, draft_tokens, tie_nats=spec_tie_nats) if spec_check else None
    if spec is not None:
        check_reference(spec, serving=serve is not None)
    if serve is None:
        if len(words) != 1 or words[0].startswith("-"):
            raise UsageError(
                "eval served needs the URL of a running server, or --serve ARTIFACT",
                hint="qwenquant eval served http://127.0.0.1:8000 (vLLM flags after -- go with --serve)",
            )
        from qwenquant.net.http import check_url

        with json_on_failure(as_json, {"kind": "served"}):  # --json: one JSON document, the error's too
            _served(check_url(words[0], "URL"), ask, report, as_json, spec)
        return
    if words and not words[0].startswith("-"):
        raise UsageError(f"give a URL ({words[0]}) or --serve ARTIFACT, not both", hint="vLLM flags go after --")
    with json_on_failure(as_json, {"kind": "served"}):
        _serve_and_gate(server.to_request(serve, words), ask, report, as_json, spec)


@eval_app.command("gates")
def gates(as_json: AsJson = False) -> None:
    """List the shipped gates: name, tasks, cases and what each is for.

    Examples:

      qwenquant eval gates

      qwenquant eval gates --json
    """
    from qwenquant.console import stdout
    from qwenquant.evaluate.served import describe_gates

    found = describe_gates()
    if as_json:
        print(json.dumps([dataclasses.asdict(g) for g in found], indent=2))
        return
    for g in found:
        stdout.print(f"{g.name}: {g.tasks} tasks, {g.cases} cases. {g.description}", markup=False)


def _tell_where(asked: Path, written: Written) -> None:
    """Where eval's report went, one `report:` line on stderr."""
    from qwenquant.console import console

    if written.failed is None:
        console.print(f"report: {asked}", markup=False)
        return
    went = f"the report went to {written.path} instead, and to stdout" if written.path else "the report is on stdout"
    console.print(f"report: could not write {asked} ({written.failed}); {went}", markup=False, soft_wrap=True)


def _emit(result: EvalReport, path: Path | None, as_json: bool) -> str | None:
    """Hand the report to the output sink (reportsink.deliver): the JSON to `path`, the verdict line, the JSON
    on stdout with --json. A write that fails keeps the measurement (on stdout, and in a spare file when
    one can be written). Returns why it failed (None: written)."""
    from qwenquant.reportsink import Sink, deliver, unique_spare

    sink = Sink(spare=unique_spare("qwenquant-eval-"), tell=_tell_where, stdout_on_failure=True)
    written = deliver(lambda _: result.to_json(), path, sink, as_json=as_json, verdict=result.verdict())
    return f"report {path} could not be written ({written.failed})" if written.failed else None


def _fail_write(failed: str | None) -> None:
    from qwenquant.errors import UsageError
    from qwenquant.reportsink import delivered

    if failed:  # after the report was delivered: --json printed it, not this error
        raise delivered(
            UsageError(
                failed + ": the measurement was printed on stdout",
                hint="free space or pass --report in a folder you can write, then run eval again",
            )
        )


def _print_served(result: ServedReport) -> None:
    """What a user reads of a served run, one line per task, tool case, needle depth, and MTP."""
    from qwenquant.console import console

    for t in result.tasks:
        console.print(f"task {t.name}: {t.passed}/{t.total} passed", markup=False)
    for c in result.tools.cases if result.tools is not None else []:
        console.print(
            f"tool case {c.name}: {c.kind.replace('_', ' ')}" + (f" ({c.problems[0]})" if c.problems else ""),
            markup=False,
        )
    for r in result.needle.depths if result.needle is not None else []:
        console.print(
            f"needle at depth {r.needle_tokens:,} of {r.prompt_tokens:,} tokens ({r.depth:g}): "
            f"{'passed' if r.passed else 'failed'}",
            markup=False,
        )
    m = result.mtp
    mal = m.mean_acceptance_length
    if m.unavailable:
        console.print(f"MTP: not measured ({m.unavailable})", markup=False)
        return
    console.print(
        f"MTP over the {' and '.join(m.over)}: {m.drafts} drafts, {m.accepted_tokens}/"
        f"{m.draft_tokens} draft tokens accepted, mean acceptance length "
        f"{'n/a' if mal is None else f'{mal:.3f}'}, per position "
        + ", ".join(f"{p}: {'n/a' if v is None else f'{100 * v:.1f}%'}" for p, v in m.per_position.items()),
        markup=False,
        soft_wrap=True,
    )


def _finish_served(result: ServedReport, path: Path | None, as_json: bool) -> None:
    """Write and print the served report; exit 8 on a failed gate, 2 when only the report write failed."""
    from qwenquant.errors import BenchError

    _print_served(result)
    if result.spec_check:
        from qwenquant.console import console
        from qwenquant.evaluate.speccheck import spec_check_line

        console.print(spec_check_line(result.spec_check), markup=False, soft_wrap=True)
    failed_write = _emit(result, path, as_json)
    if result.failures:
        from qwenquant.reportsink import delivered

        raise delivered(
            BenchError(
                "served gate failed: " + "; ".join(result.failures),
                hint="compare with the bf16 source served the same way; see `qwenquant eval offline "
                "ARTIFACT --reference SOURCE`",
            )
        )
    _fail_write(failed_write)


def _served(url: str, ask: ServedAsk, report: Path | None, as_json: bool, spec: SpecCheckAsk | None = None) -> None:
    from qwenquant.evaluate.inputs import check_report_target
    from qwenquant.evaluate.served import base_url
    from qwenquant.evaluate.servedrun import run_served
    from qwenquant.evaluate.speccheck import refuse_drafting_reference, run_spec_check, with_spec_check

    gate = ask.check()
    if report is not None:
        check_report_target(report, {"url": base_url(url), "gate": gate.name}, explicit=True, kind="served")
    if spec is not None and spec.reference_url:
        refuse_drafting_reference(base_url(spec.reference_url), ask.api_key)
    result = run_served(url, ask)
    if spec is not None:
        result = with_spec_check(result, run_spec_check(base_url(url), result.model, spec, ask.api_key))
    _finish_served(result, report, as_json)


def _without_speculation(
    req: ServeRequest, model: str, spec: SpecCheckAsk, drafted: Drafted, api_key: str | None
) -> SpecCheckResult:
    """The speculation check's second half: the same artifact served with MTP off (`--speculative-config null`),
    the same prompts greedily, compared with what the drafting server generated."""
    from qwenquant.console import console
    from qwenquant.evaluate.speccheck import against_reference, reference_drafting_problem
    from qwenquant.serve.launched import launched

    with launched(req.replace(extra=(*req.extra, "--speculative-config", "null"))) as s:
        console.print(f"serving {req.artifact} without speculation at {s.url} for the speculation check", markup=False)
        problem = reference_drafting_problem(s.url, api_key)
        result = None if problem else against_reference(s.url, model, spec, drafted, api_key)
        console.print("stopping the server", markup=False)
    if problem or result is None:
        from qwenquant.errors import BenchError

        raise BenchError(
            f"speculation check: {problem}", hint="report this: -- --speculative-config null did not turn MTP off"
        )
    return result


def _served_target(req: ServeRequest, report: Path | None, root: str, gate: str | None, config: dict) -> Path:
    """Where the served report of this configuration goes (the default path names it: two configurations,
    two reports), checked before measuring; an unresolved activations (None: the profile's) is not compared."""
    from qwenquant.evaluate.inputs import check_report_target
    from qwenquant.evaluate.report import report_path, served_kind

    target = report or report_path(req.artifact, root, kind=served_kind(**config))
    identity = {"root_digest": root, "gate": gate, **{f"served.{k}": v for k, v in config.items() if v is not None}}
    check_report_target(target, identity, explicit=report is not None, kind="served")
    return target


def _serve_and_gate(
    req: ServeRequest, ask: ServedAsk, report: Path | None, as_json: bool, spec: SpecCheckAsk | None = None
) -> None:
    """Start `req.artifact` as `qwenquant serve` would, run the gate, stop the server; report keyed to its root digest."""
    from qwenquant.console import console
    from qwenquant.evaluate.reportparts import ServedMachine
    from qwenquant.evaluate.servedrun import run_served
    from qwenquant.evaluate.speccheck import drafted_outputs, with_spec_check
    from qwenquant.manifest import load_manifest
    from qwenquant.serve.launched import launched

    gate = ask.check()
    root = load_manifest(req.artifact).root_digest
    asked = {"activations": req.activations, "profile": req.profile_name, "extra_vllm_flags": list(req.extra)}
    target = _served_target(req, report, root, gate.name, asked)
    with launched(req) as s:
        console.print(
            f"serving {req.artifact} at {s.url} (profile {s.info['profile']}, log {s.spec.log_path})", markup=False
        )
        # the configuration as the server runs it (the profile's activations resolved): its own report
        target = _served_target(req, report, s.info["artifact_root_digest"], gate.name, {k: s.info[k] for k in asked})
        result = run_served(s.url, ask, ask.model or s.model)
        drafted = drafted_outputs(s.url, result.model, spec, ask.api_key) if spec is not None else None
        console.print("stopping the server", markup=False)
    if spec is not None and drafted is not None:
        result = with_spec_check(result, _without_speculation(req, result.model, spec, drafted, ask.api_key))
    result.served = ServedMachine.model_validate(s.info)
    result.root_digest = result.served.artifact_root_digest
    _finish_served(result, target, as_json)
