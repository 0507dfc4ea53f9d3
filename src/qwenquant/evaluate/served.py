"""Served eval: an exact-match gate of short tasks through a server's OpenAI API (greedy), plus MTP
acceptance from the deltas of vLLM's /metrics counters over the run (read by qwenquant.net.prometheus,
as `qwenquant bench` reads them). Standard library and the typed report parts (reportparts)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qwenquant.errors import BenchError, UsageError
from qwenquant.evaluate.reportparts import Acceptance, CaseFailure, Task
from qwenquant.evaluate.specs import GATE_HINT, NO_GATE, Gate, evalsets_dir, read_spec
from qwenquant.net.http import HttpError, get_json, get_text, post_json, server_hint
from qwenquant.net.prometheus import SpecCounters, spec_counters

REQUEST_TIMEOUT = 120.0


# shipped task sets beside the gates that are not gates: `eval --tools` and `eval --needle` read them
TASK_SETS = ("tools", "needle")
TASK_SET_HINT = "the shipped tools and needle tasks run with --tools and --needle (with --gate none)"


def load_gate(name_or_path: str) -> Gate:
    """A gate definition: a shipped name (`qwenquant/data/evalsets/NAME.json`) or a JSON file path;
    `none` is the empty gate (no exact-match tasks)."""
    if name_or_path == "none":
        return NO_GATE
    if name_or_path in TASK_SETS and not Path(name_or_path).is_file():
        raise UsageError(f"gate {name_or_path!r} has no exact-match tasks", hint=TASK_SET_HINT)
    path = Path(name_or_path)
    if not path.is_file():
        path = evalsets_dir() / f"{name_or_path}.json"
    if not path.is_file():
        raise UsageError(
            f"no gate named {name_or_path!r}",
            hint=f"shipped gates: {', '.join(list_gates())} (`qwenquant eval gates`), or a JSON file",
        )
    return read_spec(path, Gate, "gate", GATE_HINT, first=_gate_problem)


def _gate_problem(gate: Any) -> str | None:
    """The first field of a gate definition that run_gate could not use (None: fine); the Gate model
    checks the rest."""
    if not isinstance(gate, dict) or not isinstance(gate.get("tasks"), list) or not gate["tasks"]:
        return "needs a non-empty `tasks` list"
    for i, task in enumerate(gate["tasks"]):
        if not isinstance(task, dict) or not isinstance(task.get("name"), str):
            return f"tasks[{i}] needs a `name`"
        cases = task.get("cases")
        if not isinstance(cases, list) or not cases:
            return f"tasks[{i}] ({task['name']}) needs a non-empty `cases` list"
        for j, case in enumerate(cases):
            if not (
                isinstance(case, dict) and isinstance(case.get("prompt"), str) and isinstance(case.get("expect"), str)
            ):
                return f"tasks[{i}].cases[{j}] needs string `prompt` and `expect`"
    runs = gate.get("acceptance_runs", [])
    if not isinstance(runs, list) or not all(isinstance(r, dict) and isinstance(r.get("prompt"), str) for r in runs):
        return 'acceptance_runs must be a list of {"prompt"} objects'
    return None


def list_gates() -> list[str]:
    """Names of the shipped gates (data/evalsets/*.json)."""
    names = (p.name.removesuffix(".json") for p in evalsets_dir().iterdir() if p.name.endswith(".json"))
    return sorted(n for n in names if n not in TASK_SETS)


@dataclass(frozen=True)
class GateLine:
    """One shipped gate as `qwenquant eval gates` lists it."""

    name: str
    description: str
    tasks: int
    cases: int


def describe_gates() -> list[GateLine]:
    """name, description and task count of every shipped gate (`qwenquant eval gates`)."""
    out = []
    for name in list_gates():
        gate = load_gate(name)
        out.append(GateLine(name, gate.description, len(gate.tasks), sum(len(t.cases) for t in gate.tasks)))
    return out


def base_url(url: str) -> str:
    """The server's root: a trailing slash and a trailing `/v1` dropped (OpenAI clients take a base URL
    ending in /v1; eval adds /v1/... itself and reads /metrics and /tokenize at the root)."""
    url = url.rstrip("/")
    return url[: -len("/v1")].rstrip("/") if url.endswith("/v1") else url


def _call(fn: Any, url: str, *args: Any, api_key: str | None) -> Any:
    try:
        return fn(url, *args, api_key=api_key, timeout=REQUEST_TIMEOUT)
    except HttpError as e:
        raise BenchError(e.message, hint=server_hint(e, api_key)) from None


def acceptance(before: SpecCounters | str, after: SpecCounters | str, over: Sequence[str] = ()) -> Acceptance:
    """MTP figures from two counter snapshots taken before and after the requests `over` names: mean acceptance
    length (1 + accepted / drafts) and the acceptance rate at each draft position (accepted at position / drafts).
    A snapshot that is a string says why /metrics could not be read: no figures, and `unavailable` says why."""
    if isinstance(before, str) or isinstance(after, str):
        return Acceptance(
            metrics_present=False,
            unavailable=before if isinstance(before, str) else str(after),
            drafts=0,
            draft_tokens=0,
            accepted_tokens=0,
            mean_acceptance_length=None,
            per_position={},
            over=list(over),
        )
    d = after.minus(before)
    drafted = d.drafts > 0
    return Acceptance(
        metrics_present=after.present,
        drafts=int(d.drafts),
        draft_tokens=int(d.draft_tokens),
        accepted_tokens=int(d.accepted),
        mean_acceptance_length=d.mean_acceptance_length,
        per_position={str(p): (d.per_pos[p] / d.drafts if drafted else None) for p in sorted(d.per_pos)},
        over=list(over),
    )


def model_name(url: str, api_key: str | None) -> str:
    """The first model `url`/v1/models lists; a BenchError (exit 8) naming what came back otherwise."""
    body = _call(get_json, f"{url}/v1/models", api_key=api_key)
    models = body.get("data") if isinstance(body, dict) else None
    hint = "pass --model NAME, or check that the URL is an OpenAI-compatible server's base URL"
    if not isinstance(models, list):
        raise BenchError(
            f"GET {url}/v1/models answered without a `data` list of models: {json.dumps(body)[:120]}", hint=hint
        )
    if not models:
        raise BenchError(f"{url} serves no model (GET /v1/models lists none)", hint=hint)
    first = models[0]
    if not isinstance(first, dict) or not isinstance(first.get("id"), str):
        raise BenchError(
            f"GET {url}/v1/models lists a model without a string `id`: {json.dumps(first)[:120]}", hint=hint
        )
    return first["id"]


def counters(url: str, api_key: str | None) -> SpecCounters | str:
    """The speculative-decoding counters of `url`/metrics, or why they cannot be read (a server that
    answers another status: no /metrics, behind a proxy). No answer at all is a BenchError."""
    try:
        return spec_counters(get_text(f"{url}/metrics", api_key=api_key, timeout=REQUEST_TIMEOUT))
    except HttpError as e:
        if e.status is None:
            raise BenchError(e.message, hint=server_hint(e, api_key)) from None
        return f"GET {url}/metrics answered {e.status}"


def run_tasks(url: str, gate: Gate, model: str, api_key: str | None = None) -> list[Task]:
    """Every case of `gate` greedily through /v1/completions, then its acceptance runs; pass count per task."""
    tasks = []
    for task in gate.tasks:
        failures, passed = [], 0
        for case in task.cases:
            body = {
                "model": model,
                "prompt": case.prompt,
                "max_tokens": case.max_tokens or task.max_tokens,
                "temperature": 0.0,
            }
            text = _call(post_json, f"{url}/v1/completions", body, api_key=api_key)["choices"][0]["text"]
            if text.startswith(case.expect):
                passed += 1
            else:
                failures.append(CaseFailure(prompt=case.prompt, expect=case.expect, got=text))
        tasks.append(Task(name=task.name, passed=passed, total=len(task.cases), min_pass=task.needs, failures=failures))
    for run in gate.acceptance_runs:  # longer greedy generations: enough drafts to measure MTP
        body = {
            "model": model,
            "prompt": run.prompt,
            "max_tokens": run.max_tokens,
            "temperature": 0.0,
            "ignore_eos": True,
        }
        _call(post_json, f"{url}/v1/completions", body, api_key=api_key)
    return tasks


def gate_failures(tasks: Sequence[Task], m: Acceptance, min_acceptance_length: float | None) -> list[str]:
    """Why the served run fails its gate (empty when it passes)."""
    out = [f"task {t.name}: {t.passed}/{t.total} passed, needs {t.min_pass}" for t in tasks if t.passed < t.min_pass]
    if min_acceptance_length is not None:
        mal = m.mean_acceptance_length
        if m.unavailable:
            out.append(f"MTP acceptance cannot be judged: {m.unavailable} (vLLM serves its counters there)")
        elif mal is None:
            out.append(
                "the server reported no speculative drafts over the run's requests (is MTP on? "
                "vllm:spec_decode_* counters)"
            )
        elif mal < min_acceptance_length:
            out.append(f"MTP mean acceptance length {mal:.3f} is below {min_acceptance_length}")
    return out
