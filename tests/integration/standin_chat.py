"""The stand-in server's non-streamed chat answers (tests/integration/standin.py): tool calls as its
`tool_mode` switch says, the needle task's answer (right, or wrong from `needle_fail_from` prompt
tokens on), and /tokenize's count (whitespace-separated words). STAND-IN, not vLLM: a real server
cannot be told to return a malformed tool call or to miss a needle at a chosen depth.
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


def chat_answer(s: Any, body: dict[str, Any]) -> dict[str, Any]:
    """A non-streamed chat completion: a tool call as `tool_mode` says, or the needle's answer."""
    message: dict[str, Any] = {"role": "assistant", "content": "w0 w1 "}
    n = words(body)
    if body.get("tools") and s.tool_mode != "answer":
        fn = body["tools"][0]["function"]
        args = _example(fn.get("parameters") or {})
        raw = {"call": json.dumps(args), "malformed": '{"city": "Lisbon"', "mismatch": "{}"}.get(s.tool_mode)
        if s.tool_mode == "markup":
            message["content"] = f'<tool_call>\n<function={fn["name"]}>\n</tool_call>'
        else:
            message = {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call-0", "type": "function", "function": {"name": fn["name"], "arguments": raw}}]}
    elif not body.get("tools"):
        code = re.search(r"is (\d{6})\.", str(body["messages"][-1].get("content", "")))
        if code:
            wrong = s.needle_fail_from is not None and n >= s.needle_fail_from
            message["content"] = "000000" if wrong else code.group(1)
    return {"id": "chatcmpl-standin", "object": "chat.completion", "model": s.model,
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": n, "completion_tokens": 2, "total_tokens": n + 2}}
