"""Served tool-calling gate: shipped tool schemas (no-argument, required-argument, nested JSON) sent
through a server's chat API; each answer must be a well-formed call of a sent tool whose arguments
parse as JSON and match the tool's schema, or a plain answer. Standard library only: the schema
check is a small JSON-schema subset (type, enum, required, properties, additionalProperties, items).
"""

from __future__ import annotations

import json
from typing import Any

from qwenquant.net.http import HttpError, fetch

REQUEST_TIMEOUT = 120.0
_TYPES: dict[str, tuple[type, ...]] = {"object": (dict,), "array": (list,), "string": (str,), "boolean": (bool,),
                                       "integer": (int,), "number": (int, float), "null": (type(None),)}
# raw tool-call markup left in the text: the server's parser did not turn it into a call
_MARKUP = ("<tool_call>", "<function=", "</tool_call>")


def schema_problems(value: Any, schema: dict[str, Any], path: str = "arguments") -> list[str]:
    """Where `value` breaks `schema` (the subset above), one sentence per problem."""
    out: list[str] = []
    want = schema.get("type")
    if want is not None:
        kinds = want if isinstance(want, list) else [want]
        ok = any(isinstance(value, _TYPES.get(k, ())) and not (k in ("integer", "number") and isinstance(value, bool))
                 for k in kinds)
        if not ok:
            return [f"{path} is {type(value).__name__} {json.dumps(value)[:40]}, not {'/'.join(kinds)}"]
    if "enum" in schema and value not in schema["enum"]:
        out.append(f"{path} is {json.dumps(value)[:40]}, not one of {schema['enum']}")
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        out += [f"{path} lacks required {k!r}" for k in schema.get("required") or [] if k not in value]
        for k, v in value.items():
            if k in props:
                out += schema_problems(v, props[k], f"{path}.{k}")
            elif schema.get("additionalProperties") is False:
                out.append(f"{path} has {k!r}, which the schema does not allow")
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, v in enumerate(value):
            out += schema_problems(v, schema["items"], f"{path}[{i}]")
    return out


def judge(message: dict[str, Any], tools: list[dict[str, Any]]) -> dict[str, Any]:
    """One chat answer: {"kind": tool_call | answer | malformed, "problems": [...], "calls": [...]}."""
    schemas = {t["function"]["name"]: t["function"].get("parameters") or {} for t in tools}
    calls = message.get("tool_calls") or []
    content = message.get("content") or ""
    problems: list[str] = []
    seen = []
    for i, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or call.get("type", "function") != "function":
            problems.append(f"call {i} is not a function call: {json.dumps(call)[:80]}")
            continue
        name, raw = fn.get("name"), fn.get("arguments")
        seen.append({"name": name, "arguments": raw})
        if name not in schemas:
            problems.append(f"call {i} names {name!r}, which was not sent (sent: {', '.join(schemas)})")
            continue
        try:
            args = json.loads(raw) if isinstance(raw, str) else raw
        except ValueError as e:
            problems.append(f"call {i} ({name}): arguments are not JSON ({e.msg}): {str(raw)[:60]!r}")
            continue
        problems += [f"call {i} ({name}): {p}" for p in schema_problems(args, schemas[name])]
    if not calls and any(m in content for m in _MARKUP):
        problems.append(f"tool-call markup left in the text (the server did not parse it): {content.strip()[:80]!r}")
    kind = "malformed" if problems else ("tool_call" if calls else "answer")
    return {"kind": kind, "problems": problems, "calls": seen, "content": content[:200]}


def run_tools(url: str, spec: dict[str, Any], model: str, api_key: str | None = None) -> dict[str, Any]:
    """Send every case of `spec` (greedy, thinking off) and judge each answer."""
    url = url.rstrip("/")
    cases = []
    for case in spec["cases"]:
        body = {"model": model, "messages": case["messages"], "tools": case["tools"],
                "tool_choice": case.get("tool_choice", "auto"), "temperature": 0.0,
                "max_tokens": case.get("max_tokens", spec.get("max_tokens", 256)),
                "chat_template_kwargs": {"enable_thinking": False}}
        row: dict[str, Any] = {"name": case["name"], "tool_choice": body["tool_choice"]}
        try:
            r = fetch(f"{url}/v1/chat/completions", body, api_key=api_key, timeout=REQUEST_TIMEOUT)
        except HttpError as e:
            row.update(kind="error", problems=[e.message])
            cases.append(row)
            continue
        if not 200 <= r.status < 300:
            row.update(kind="error", problems=[f"the server refused the request ({r.status}): {r.text[:160]}"])
        else:
            try:
                message = json.loads(r.text)["choices"][0]["message"]
            except (ValueError, KeyError, IndexError, TypeError):
                message = None
            if not isinstance(message, dict):
                row.update(kind="error", problems=[f"no chat message in the answer: {r.text[:160]}"])
            else:
                row.update(judge(message, case["tools"]))
        row["ok"] = not row["problems"]
        cases.append(row)
    return {"gate": spec.get("name", "tools"), "cases": cases,
            "counts": {k: sum(c["kind"] == k for c in cases) for k in ("tool_call", "answer", "malformed", "error")}}


def tool_failures(report: dict[str, Any]) -> list[str]:
    """One line per failing case (empty when every answer is a well-formed call or a plain answer)."""
    return [f"tool case {c['name']}: {'malformed tool call' if c['kind'] == 'malformed' else 'request failed'}: "
            f"{c['problems'][0]}" for c in report["cases"] if c["problems"]]
