"""`qwenquant eval`: what quantization cost (offline, against the source) and whether MTP still accepts (served)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer

from qwenquant.commands._app import app


@app.command("eval")
def eval_cmd(
    artifact: Optional[Path] = typer.Argument(None, help="Artifact folder (with qwenquant-manifest.json)."),
    reference: Optional[Path] = typer.Option(None, "--reference", help="The bf16 source checkpoint folder."),
    windows: int = typer.Option(32, "--windows", help="Held-out windows to evaluate on."),
    window_len: int = typer.Option(256, "--window-len", help="Tokens per window."),
    text: Optional[Path] = typer.Option(None, "--text", help="Local text file to cut windows from (default: the tiny reference's held-out text)."),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda."),
    report: Optional[Path] = typer.Option(None, "--report", help="Where the JSON report goes (default: beside the artifact)."),
    served: Optional[str] = typer.Option(None, "--served", help="Base URL of a running server: run the exact-match gate through it."),
    gate: str = typer.Option("tiny-reference", "--gate", help="Gate name (shipped) or JSON file, with --served."),
    model: Optional[str] = typer.Option(None, "--model", help="Served model name (default: the server's first)."),
    min_acceptance: Optional[float] = typer.Option(None, "--min-acceptance-length", help="Fail when MTP mean acceptance length is below this (with --served)."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON on stdout."),
) -> None:
    """Measure an artifact against its source: paired perplexity, KL, top-1, lm_head and MTP figures.

    Offline, both models run one torch forward over dequantized weights on the same held-out windows.

    With --served, run a gate of exact-match tasks through a server's OpenAI API and read MTP acceptance from its /metrics counters; a failed task or a low acceptance exits non-zero.

    Examples:

      qwenquant eval artifacts/tiny --reference models/tiny-reference

      qwenquant eval --served http://127.0.0.1:8000 --min-acceptance-length 1.2 --json
    """
    from qwenquant.errors import UsageError

    if served is not None:
        _served(served, gate, model, min_acceptance, report, as_json)
        return
    if artifact is None or reference is None:
        raise UsageError("eval needs ARTIFACT and --reference SOURCE (or --served URL)",
                         hint="qwenquant eval artifacts/q --reference models/source")
    _offline(artifact, reference, windows, window_len, text, device, report, as_json)


def _emit(result: dict[str, Any], path: Optional[Path], as_json: bool) -> None:
    from qwenquant.atomic import atomic_write_bytes, pretty_json
    from qwenquant.console import console

    if path is not None:
        atomic_write_bytes(path, pretty_json(result))
        console.print(f"report: {path}", markup=False)
    if as_json:
        print(json.dumps(result, indent=2, sort_keys=True))


def _offline(artifact: Path, reference: Path, windows: int, window_len: int, text: Optional[Path],
             device: str, report: Optional[Path], as_json: bool) -> None:
    from qwenquant.console import console
    from qwenquant.evaluate import report as rep
    from qwenquant.evaluate.offline import run_offline
    from qwenquant.evaluate.texts import eval_windows
    from qwenquant.manifest import load_manifest

    root = load_manifest(artifact).root_digest
    ids = eval_windows(reference, windows, window_len, text)
    result = run_offline(reference, artifact, ids, device=device)
    result.update(artifact=str(artifact), reference=str(reference), root_digest=root,
                  text=str(text) if text else "tiny-reference held-out")
    result["goals"] = rep.goals(result)
    console.print(rep.offline_table(result))
    for line in rep.summary_lines(result):
        console.print(line, markup=False)
    _emit(result, report or rep.report_path(artifact, root), as_json)


def _served(url: str, gate: str, model: Optional[str], min_acceptance: Optional[float],
            report: Optional[Path], as_json: bool) -> None:
    from qwenquant.console import console
    from qwenquant.errors import BenchError
    from qwenquant.evaluate.served import gate_failures, load_gate, run_gate

    result = run_gate(url, load_gate(gate), model)
    failures = gate_failures(result, min_acceptance)
    result.update(min_acceptance_length=min_acceptance, failures=failures, ok=not failures)
    for t in result["tasks"]:
        console.print(f"task {t['name']}: {t['passed']}/{t['total']} passed", markup=False)
    m = result["mtp"]
    mal = m["mean_acceptance_length"]
    console.print(f"MTP: {m['drafts']} drafts, {m['accepted_tokens']}/{m['draft_tokens']} draft tokens accepted, "
                  f"mean acceptance length {'n/a' if mal is None else f'{mal:.3f}'}, per position "
                  + ", ".join(f"{p}: {'n/a' if v is None else f'{100 * v:.1f}%'}" for p, v in m["per_position"].items()),
                  markup=False)
    _emit(result, report, as_json)
    if failures:
        raise BenchError("served gate failed: " + "; ".join(failures),
                             hint="compare with the bf16 source served the same way; see `qwenquant eval ARTIFACT --reference`")
