"""Served eval: an exact-match gate of short tasks through a server's OpenAI API (greedy), plus MTP
acceptance from the deltas of vLLM's /metrics counters over the run. Standard library only."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from importlib import resources
from pathlib import Path
from typing import Any

from qwenquant.errors import BenchError, UsageError

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)')
_POSITION = re.compile(r'position="(\d+)"')


def load_gate(name_or_path: str) -> dict[str, Any]:
    """A gate definition: a shipped name (`qwenquant/data/evalsets/NAME.json`) or a JSON file path."""
    path = Path(name_or_path)
    if not path.is_file():
        path = Path(str(resources.files("qwenquant") / "data" / "evalsets" / f"{name_or_path}.json"))
    if not path.is_file():
        raise UsageError(f"no gate named {name_or_path!r}", hint="pass a shipped gate name (tiny-reference) or a JSON file")
    return json.loads(path.read_text())


def _request(url: str, body: dict[str, Any] | None = None, timeout: float = 120) -> bytes:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.read()
    except (urllib.error.URLError, OSError) as e:
        raise BenchError(f"request to {url} failed: {e}", hint="check the server is up (`qwenquant serve ...` prints ready)") from e


def parse_metrics(text: str) -> dict[str, Any]:
    """The speculative-decoding counters of a Prometheus text page: sums over label sets, per position."""
    out: dict[str, Any] = {DRAFTS: 0.0, DRAFT_TOKENS: 0.0, ACCEPTED: 0.0, PER_POS: {}, "present": False}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m or line.startswith("#"):
            continue
        name, labels, value = m.group(1), m.group(2) or "", float(m.group(3))
        if name in (DRAFTS, DRAFT_TOKENS, ACCEPTED):
            out[name] += value
            out["present"] = True
        elif name == PER_POS:
            pos = _POSITION.search(labels)
            if pos:
                out[PER_POS][int(pos.group(1))] = out[PER_POS].get(int(pos.group(1)), 0.0) + value
    return out


def acceptance(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """MTP figures from two counter snapshots: mean acceptance length (1 + accepted / drafts) and the
    acceptance rate at each draft position (accepted at position / drafts)."""
    drafts = after[DRAFTS] - before[DRAFTS]
    accepted = after[ACCEPTED] - before[ACCEPTED]
    per_pos = {p: after[PER_POS][p] - before[PER_POS].get(p, 0.0) for p in sorted(after[PER_POS])}
    return {
        "metrics_present": after["present"],
        "drafts": int(drafts),
        "draft_tokens": int(after[DRAFT_TOKENS] - before[DRAFT_TOKENS]),
        "accepted_tokens": int(accepted),
        "mean_acceptance_length": 1 + accepted / drafts if drafts > 0 else None,
        "per_position": {str(p): (v / drafts if drafts > 0 else None) for p, v in per_pos.items()},
    }


def _model_name(url: str) -> str:
    models = json.loads(_request(f"{url}/v1/models"))["data"]
    if not models:
        raise BenchError(f"{url} serves no model", hint="pass --model NAME")
    return models[0]["id"]


def run_gate(url: str, gate: dict[str, Any], model: str | None = None) -> dict[str, Any]:
    """Run every case of `gate` greedily through /v1/completions; pass count per task and MTP acceptance."""
    url = url.rstrip("/")
    model = model or _model_name(url)
    before = parse_metrics(_request(f"{url}/metrics").decode())
    tasks = []
    for task in gate["tasks"]:
        failures, passed = [], 0
        for case in task["cases"]:
            body = {"model": model, "prompt": case["prompt"], "max_tokens": case.get("max_tokens", task.get("max_tokens", 16)),
                    "temperature": 0.0}
            text = json.loads(_request(f"{url}/v1/completions", body))["choices"][0]["text"]
            if text.startswith(case["expect"]):
                passed += 1
            else:
                failures.append({"prompt": case["prompt"], "expect": case["expect"], "got": text})
        tasks.append({"name": task["name"], "passed": passed, "total": len(task["cases"]),
                      "min_pass": task.get("min_pass", len(task["cases"])), "failures": failures})
    for run in gate.get("acceptance_runs", []):  # longer greedy generations: enough drafts to measure MTP
        body = {"model": model, "prompt": run["prompt"], "max_tokens": run.get("max_tokens", 64), "temperature": 0.0,
                "ignore_eos": True}
        _request(f"{url}/v1/completions", body)
    after = parse_metrics(_request(f"{url}/metrics").decode())
    return {"url": url, "model": model, "gate": gate.get("name"), "tasks": tasks, "mtp": acceptance(before, after)}


def gate_failures(report: dict[str, Any], min_acceptance_length: float | None) -> list[str]:
    """Why the served run fails its gate (empty when it passes)."""
    out = [f"task {t['name']}: {t['passed']}/{t['total']} passed, needs {t['min_pass']}"
           for t in report["tasks"] if t["passed"] < t["min_pass"]]
    if min_acceptance_length is not None:
        mal = report["mtp"]["mean_acceptance_length"]
        if mal is None:
            out.append("the server reported no speculative drafts (is MTP on? vllm:spec_decode_* counters)")
        elif mal < min_acceptance_length:
            out.append(f"MTP mean acceptance length {mal:.3f} is below {min_acceptance_length}")
    return out
