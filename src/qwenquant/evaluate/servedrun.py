"""One served eval run: the exact-match gate, the tool-calling gate and the needle task against one
server, with MTP acceptance read from /metrics before the first request and after the last, so the
figure covers every request the run sent. `ServedAsk.check` refuses, before any server is asked, a
run that would test nothing. Standard library and the typed report (pydantic parts)."""

from __future__ import annotations

from dataclasses import dataclass

from qwenquant.errors import UsageError
from qwenquant.evaluate.needle import check_needle_max_len, needle_failures, run_needle
from qwenquant.evaluate.report import ServedReport
from qwenquant.evaluate.served import (
    acceptance,
    base_url,
    counters,
    gate_failures,
    load_gate,
    model_name,
    run_tasks,
)
from qwenquant.evaluate.specs import Gate, needle_spec, tools_spec
from qwenquant.evaluate.tools import run_tools, tool_failures
from qwenquant.net.prometheus import SpecCounters


@dataclass(frozen=True)
class ServedAsk:
    """What a served eval is asked (the same with --served URL and --serve ARTIFACT)."""

    gate: str = "tiny-reference"
    model: str | None = None
    api_key: str | None = None
    min_acceptance: float | None = None
    tools: bool = False
    needle: bool = False
    needle_max_len: int | None = None

    def check(self) -> Gate:
        """Before any server is asked: the gate and the task sets asked for load, the run tests something,
        --needle-max-len leaves a needle case. Returns the loaded gate."""
        gate = load_gate(self.gate)
        needle = needle_spec() if self.needle else None
        if self.tools:
            tools_spec()
        if self.min_acceptance is not None and not 1.0 <= self.min_acceptance:
            raise UsageError(
                f"--min-acceptance-length {self.min_acceptance:g} is below 1: the mean acceptance "
                f"length counts the target's own token of each step (1 + accepted drafts)",
                hint="pass a value from 1 up to the server's draft tokens + 1 (e.g. 1.5)",
            )
        if not gate.tasks and not self.tools and not self.needle:
            raise UsageError(
                f"--gate {self.gate} with neither --tools nor --needle tests nothing"
                + (" (MTP acceptance would be measured over no request)" if self.min_acceptance else ""),
                hint="pass --tools and/or --needle, or a gate with tasks (`qwenquant eval gates`)",
            )
        if self.needle_max_len is not None:
            if not self.needle:
                raise UsageError("--needle-max-len without --needle", hint="add --needle, or drop --needle-max-len")
            check_needle_max_len(needle or needle_spec(), self.needle_max_len)
        return gate


def run_served(url: str, ask: ServedAsk, model: str | None = None) -> ServedReport:
    """Run what `ask` asks against `url` (a base URL; a trailing /v1 is dropped); the report, with
    `failures` listed and `ok` only when something was tested and nothing failed."""
    gate = ask.check()
    tools_asked, needle_asked = (tools_spec() if ask.tools else None), (needle_spec() if ask.needle else None)
    url = base_url(url)
    model = model or ask.model or model_name(url, ask.api_key)
    before = counters(url, ask.api_key)
    check_min_acceptance(ask.min_acceptance, before)
    tasks = run_tasks(url, gate, model, ask.api_key)
    tools = run_tools(url, tools_asked, model, ask.api_key) if tools_asked else None
    needle = run_needle(url, needle_asked, model, ask.api_key, ask.needle_max_len) if needle_asked else None
    over = [
        k for k, on in (("gate tasks", bool(gate.tasks)), ("tool cases", ask.tools), ("needle cases", ask.needle)) if on
    ]
    mtp = acceptance(before, counters(url, ask.api_key), over)
    failures = gate_failures(tasks, mtp, ask.min_acceptance)
    failures += tool_failures(tools) if tools is not None else []
    failures += needle_failures(needle) if needle is not None else []
    return ServedReport(
        url=url,
        model=model,
        gate=gate.name,
        tasks=tasks,
        mtp=mtp,
        tools=tools,
        needle=needle,
        min_acceptance_length=ask.min_acceptance,
        failures=failures,
        ok=not failures,
    )


def check_min_acceptance(min_acceptance: float | None, before: SpecCounters | str) -> None:
    """--min-acceptance-length above what the server can reach (1 + its draft tokens per step), refused before
    any request. vLLM 0.32 (`vllm/v1/spec_decode/metrics.py`, SpecDecodingProm) creates one child of
    `vllm:spec_decode_num_accepted_tokens_per_pos` per draft position at start, so /metrics lists the draft
    count before the first request."""
    if min_acceptance is None or isinstance(before, str) or not before.per_pos:
        return
    drafts = len(before.per_pos)
    if min_acceptance > drafts + 1:
        raise UsageError(
            f"--min-acceptance-length {min_acceptance:g} cannot be reached: the server drafts {drafts} "
            f"tokens per step, so the mean acceptance length is at most {drafts + 1}",
            hint=f"pass a value from 1 to {drafts + 1}",
        )
