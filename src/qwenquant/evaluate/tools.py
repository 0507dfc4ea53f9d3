"""Served tool-calling gate: shipped tool schemas (no-argument, required-argument, nested JSON) sent
through a server's chat API, each case with its OpenAI `tool_choice`. Every call must name a sent
tool, carry `arguments` as a JSON string (not an object) that parses to an object matching the
tool's schema; and the answer must be what `tool_choice` allows: `auto` a call or a plain answer,
`required` at least one call, `none` no call, `{"type": "function", "function": {"name": N}}` calls
of N only. Standard library and the typed report parts (reportparts): the schema check is a small JSON-schema subset (type, enum,
required, properties, additionalProperties, items).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from qwenquant.evaluate.reportparts import ToolCall, ToolCase, ToolCounts, Tools
from qwenquant.evaluate.specs import ToolCaseSpec, ToolDef, ToolsSpec
from qwenquant.net.http import HttpError, fetch

REQUEST_TIMEOUT = 120.0
_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "boolean": (bool,),
    "integer": (int,),
    "number": (int, float),
    "null": (type(None),),
}
# raw tool-call markup left in the text: the server's parser did not turn it into a call
_MARKUP = ("<tool_call>", "<function=", "</tool_call>")


def schema_problems(value: Any, schema: dict[str, Any], path: str = "arguments") -> list[str]:
    """Where `value` breaks `schema` (the subset above), one sentence per problem."""
    out: list[str] = []
    want = schema.get("type")
    if want is not None:
        kinds = want if isinstance(want, list) else [want]
        ok = any(
            isinstance(value, _TYPES.get(k, ())) and not (k in ("integer", "number") and isinstance(value, bool))
            for k in kinds
        )
        if not ok:
            return [f"{path} is {type(value).__name__} {json.dumps(value)[:40]}, not {'/'.join(kinds)}"]
    if "enum" in schema and value not in schema["enum"]:
        out.append(f"{path} is {json.dumps(value)[:40]}, not one of {schema['enum']}")
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        out += [f"{path} lacks required {k!r}" for k in schema.get("required") or [] if k not in value]
        extra = schema.get("additionalProperties")
        for k, v in value.items():
            if k in props:
                out += schema_problems(v, props[k], f"{path}.{k}")
            elif extra is False:
                out.append(f"{path} has {k!r}, which the schema does not allow")
            elif isinstance(extra, dict):
                out += schema_problems(v, extra, f"{path}.{k}")
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, v in enumerate(value):
            out += schema_problems(v, schema["items"], f"{path}[{i}]")
    return out


def choice_problems(tool_choice: Any, called: Sequence[object]) -> list[str]:
    """What the answer does that `tool_choice` forbids (OpenAI semantics), given the names it called."""
    if tool_choice in (None, "auto"):
        return []
    if tool_choice == "none":
        return [f"tool_choice none, yet the answer calls {', '.join(map(str, called))}"] if called else []
    if tool_choice == "required":
        return [] if called else ["tool_choice required, yet the answer is plain text, not a tool call"]
    want = tool_choice.get("function", {}).get("name") if isinstance(tool_choice, dict) else None
    if not want:
        return [f"tool_choice {json.dumps(tool_choice)[:60]} is none of auto, required, none or a named function"]
    if not called:
        return [f"tool_choice names {want}, yet the answer is plain text, not a call of {want}"]
    return [f"tool_choice names {want}, yet call {i} names {n!r}" for i, n in enumerate(called) if n != want]


def _call_problems(i: int, call: Any, schemas: dict[str, Any]) -> list[str]:
    """One tool call: a function call of a sent tool, arguments a JSON string whose object fits the schema."""
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or call.get("type", "function") != "function":
        return [f"call {i} is not a function call: {json.dumps(call)[:80]}"]
    name, raw = fn.get("name"), fn.get("arguments")
    if name not in schemas:
        return [f"call {i} names {name!r}, which was not sent (sent: {', '.join(schemas)})"]
    if not isinstance(raw, str):
        return [
            f"call {i} ({name}): arguments are a JSON {type(raw).__name__}, not a string of JSON "
            f"(OpenAI sends them encoded): {json.dumps(raw)[:60]}"
        ]
    try:
        args = json.loads(raw)
    except json.JSONDecodeError as e:
        return [f"call {i} ({name}): arguments are not JSON ({e.msg}): {raw[:60]!r}"]
    if not isinstance(args, dict):
        return [f"call {i} ({name}): arguments are {json.dumps(args)[:40]}, not a JSON object"]
    return [f"call {i} ({name}): {p}" for p in schema_problems(args, schemas[name])]


@dataclass(frozen=True)
class Judged:
    """One chat answer judged: tool_call | answer | malformed | wrong_choice, why, the calls as sent, the text."""

    kind: str
    problems: list[str]
    calls: list[ToolCall]
    content: str


def judge(message: Mapping[str, Any], tools: Sequence[ToolDef], tool_choice: Any = "auto") -> Judged:
    """One chat answer: its kind, its problems and its calls. `malformed`: a call that is not well formed (or
    tool-call markup left in the text); `wrong_choice`: well-formed, but not what `tool_choice` allows."""
    schemas = {t.function.name: t.function.parameters or {} for t in tools}
    calls = message.get("tool_calls") or []
    content = message.get("content") or ""
    problems: list[str] = []
    seen = []
    for i, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict):
            seen.append(ToolCall(name=fn.get("name"), arguments=fn.get("arguments")))
        problems += _call_problems(i, call, schemas)
    if not calls and any(m in content for m in _MARKUP):
        problems.append(f"tool-call markup left in the text (the server did not parse it): {content.strip()[:80]!r}")
    wrong = [] if problems else choice_problems(tool_choice, [c.name for c in seen])
    kind = "malformed" if problems else "wrong_choice" if wrong else ("tool_call" if calls else "answer")
    return Judged(kind, problems + wrong, seen, content[:200])


def _run_case(url: str, spec: ToolsSpec, case: ToolCaseSpec, model: str, api_key: str | None) -> ToolCase:
    """One case sent (greedy, thinking off) and its answer judged (kind `error` when no chat message came)."""
    choice = case.tool_choice if isinstance(case.tool_choice, str) else case.tool_choice.to_json()
    body = {
        "model": model,
        "messages": [m.to_json() for m in case.messages],
        "tools": [t.to_json() for t in case.tools],
        "tool_choice": choice,
        "temperature": 0.0,
        "max_tokens": case.max_tokens or spec.max_tokens,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    named = functools.partial(ToolCase, name=case.name, tool_choice=choice)

    def failed(problem: str) -> ToolCase:
        return named(kind="error", problems=[problem], ok=False)

    try:
        r = fetch(f"{url}/v1/chat/completions", body, api_key=api_key, timeout=REQUEST_TIMEOUT)
    except HttpError as e:
        return failed(e.message)
    if not 200 <= r.status < 300:
        return failed(f"the server refused the request ({r.status}): {r.text[:160]}")
    try:
        message = json.loads(r.text)["choices"][0]["message"]
    except (ValueError, KeyError, IndexError, TypeError):
        message = None
    if not isinstance(message, dict):
        return failed(f"no chat message in the answer: {r.text[:160]}")
    j = judge(message, case.tools, choice)
    return named(kind=j.kind, problems=j.problems, calls=j.calls, content=j.content, ok=not j.problems)


def run_tools(url: str, spec: ToolsSpec, model: str, api_key: str | None = None) -> Tools:
    """Send every case of `spec` (greedy, thinking off) and judge each answer."""
    url = url.rstrip("/")
    cases = [_run_case(url, spec, case, model, api_key) for case in spec.cases]
    kinds = ("tool_call", "answer", "malformed", "wrong_choice", "error")
    counts = ToolCounts.model_validate({k: sum(c.kind == k for c in cases) for k in kinds})
    return Tools(gate=spec.name, cases=cases, counts=counts)


_VERDICT = {"malformed": "malformed tool call", "wrong_choice": "ignored tool_choice", "error": "request failed"}


def tool_failures(tools: Tools) -> list[str]:
    """One line per failing case (empty when every answer is what its tool_choice allows, well formed)."""
    return [f"tool case {c.name}: {_VERDICT[c.kind]}: {c.problems[0]}" for c in tools.cases if c.problems]
