"""The stand-in server's non-streamed chat answers (tests/integration/standin.py): tool calls as its
`tool_mode` switch says, the needle task's answer (right, or wrong from `needle_fail_from` prompt
tokens on), and /tokenize's count (whitespace-separated words). STAND-IN, not vLLM: a real server
cannot be told to return a malformed tool call, ignore tool_choice or miss a needle at a chosen depth.

tool_mode, with the request's tool_choice honoured as OpenAI says (a call of the named function, a
call for `required`, plain text for `none`) unless the mode is a fault:
  answer        plain text where tool_choice allows it (auto, none), else the call it asks for
  call          a call where tool_choice allows it (auto, required, named), else plain text
  malformed | mismatch | markup   arguments that are not JSON | `{}` (misses required keys) | raw
                markup in the text, wherever a call is allowed
  object-arguments  a call whose `arguments` is a JSON object, not a string of JSON
  plain-always  plain text whatever tool_choice says (a plain answer to `required`)
  call-always   a call of the first sent tool whatever tool_choice says (a call under `none`)
"""

from __future__ import annotations

import json
import re
from typing import Any


def words(body: dict[str, Any]) -> int:
    """The stand-in's token count: whitespace-separated words (of the prompt, or of every message + 4)."""
    if "messages" in body:
        return sum(len(str(m.get("content", "")).split()) for m in body["messages"]) + 4
    return len(str(body.get("prompt", "")).split())


def _example(schema: dict[str, Any]) -> Any:
    """A value that satisfies a JSON schema's required keys (the subset the shipped tool schemas use)."""
    kind = schema.get("type")
    if "enum" in schema:
        return schema["enum"][0]
    if kind == "object":
        props = schema.get("properties") or {}
        return {k: _example(props.get(k, {})) for k in schema.get("required") or []}
    return {"array": [], "integer": 1, "number": 1.5, "boolean": True}.get(kind, "x")


def _choice(body: dict[str, Any]) -> tuple[bool, str | None]:
    """(whether a call is allowed, the tool a call must name or None) under the request's tool_choice."""
    choice = body.get("tool_choice", "auto")
    if choice == "none":
        return False, None
    if isinstance(choice, dict):
        return True, choice["function"]["name"]
    return True, None


def _tool_message(s: Any, body: dict[str, Any]) -> dict[str, Any]:
    allowed, named = _choice(body)
    forced = named is not None or body.get("tool_choice") == "required"
    mode = s.tool_mode
    if mode == "plain-always" or (mode != "call-always" and (not allowed or (mode == "answer" and not forced))):
        return {"role": "assistant", "content": "w0 w1 "}
    fns = {t["function"]["name"]: t["function"] for t in body["tools"]}
    fn = fns[named] if named and mode != "call-always" else body["tools"][0]["function"]
    if mode == "markup":
        return {"role": "assistant", "content": f"<tool_call>\n<function={fn['name']}>\n</tool_call>"}
    args = _example(fn.get("parameters") or {})
    raw = {"malformed": '{"city": "Lisbon"', "mismatch": "{}", "object-arguments": args}.get(mode, json.dumps(args))
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "call-0", "type": "function", "function": {"name": fn["name"], "arguments": raw}}],
    }


def chat_answer(s: Any, body: dict[str, Any]) -> dict[str, Any]:
    """A non-streamed chat completion: a tool call as `tool_mode` says, or the needle's answer."""
    message: dict[str, Any] = {"role": "assistant", "content": "w0 w1 "}
    n = words(body)
    if body.get("tools"):
        message = _tool_message(s, body)
    else:
        code = re.search(r"is (\d{6})\.", str(body["messages"][-1].get("content", "")))
        if code:
            wrong = s.needle_fail_from is not None and n >= s.needle_fail_from
            message["content"] = "000000" if wrong else code.group(1)
    return {
        "id": "chatcmpl-standin",
        "object": "chat.completion",
        "model": s.model,
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": n, "completion_tokens": 2, "total_tokens": n + 2},
    }
