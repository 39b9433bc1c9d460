"""Parse tool calls out of a model's text: Hermes/Qwen JSON and Qwen3-Coder XML styles.

Hermes / Qwen2.5 style::

    <tool_call>{"name": "Read", "arguments": {"path": "model.py"}}</tool_call>

Qwen3-Coder XML style::

    <tool_call><function=Read><parameter=path>model.py</parameter></function></tool_call>

A malformed call never raises: it comes back as a :class:`ToolCallError` whose message is precise
enough to be shown to the model as the tool result (and is counted as a schema violation).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_FUNC = re.compile(r"^\s*<function=([^>\s]+)>(.*?)</function>\s*$", re.S)
_PARAM = re.compile(r"<parameter=([^>\s]+)>(.*?)</parameter>", re.S)


@dataclass
class ParsedCall:
    name: str
    arguments: dict[str, Any]
    raw: str
    id: str = ""


@dataclass
class ToolCallError:
    message: str
    raw: str
    id: str = ""


@dataclass
class ParsedTurn:
    """The text before the first call (the model's reasoning) and the calls in order."""

    thought: str
    calls: list[ParsedCall | ToolCallError] = field(default_factory=list)

    @property
    def errors(self) -> list[ToolCallError]:
        return [c for c in self.calls if isinstance(c, ToolCallError)]


def _xml_value(v: str) -> Any:
    # values are text; strip the single newline models put around them
    if v.startswith("\n"):
        v = v[1:]
    if v.endswith("\n"):
        v = v[:-1]
    s = v.strip()
    if s[:1] in "[{" and s[-1:] in "]}":
        try:
            return json.loads(s)
        except json.JSONDecodeError:
            return v
    return v


def _parse_body(body: str, raw: str) -> ParsedCall | ToolCallError:
    text = body.strip()
    if not text:
        return ToolCallError("empty <tool_call></tool_call>", raw)
    if text.startswith("<function="):
        m = _FUNC.match(text)
        if not m:
            return ToolCallError(
                "malformed XML tool call: expected <function=NAME>"
                "<parameter=KEY>VALUE</parameter>...</function>",
                raw,
            )
        name, inner = m.group(1), m.group(2)
        args = {k: _xml_value(v) for k, v in _PARAM.findall(inner)}
        leftover = _PARAM.sub("", inner).strip()
        if leftover:
            return ToolCallError(
                f"unexpected text inside <function={name}>: {leftover[:80]!r}", raw
            )
        return ParsedCall(name, args, raw)
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        return ToolCallError(f"tool call is not valid JSON ({e.msg} at char {e.pos})", raw)
    if not isinstance(obj, dict):
        return ToolCallError("tool call JSON must be an object with 'name' and 'arguments'", raw)
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return ToolCallError("tool call JSON has no string 'name'", raw)
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models double-encode
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return ToolCallError(f"'arguments' of {name} is a string that is not JSON", raw)
    if not isinstance(args, dict):
        return ToolCallError(f"'arguments' of {name} must be an object", raw)
    return ParsedCall(name, args, raw)


def parse_tool_calls(text: str) -> ParsedTurn:
    """All tool calls in ``text``, in order; unterminated or malformed ones as errors."""
    first = text.find(OPEN)
    thought = text if first < 0 else text[:first]
    turn = ParsedTurn(thought=thought.strip())
    pos = first
    while pos >= 0:
        end = text.find(CLOSE, pos + len(OPEN))
        nxt = text.find(OPEN, pos + len(OPEN))
        if end < 0 or (0 <= nxt < end):
            stop = nxt if nxt >= 0 else len(text)
            turn.calls.append(
                ToolCallError("unterminated <tool_call> (no </tool_call>)", text[pos:stop])
            )
            pos = nxt
            continue
        raw = text[pos : end + len(CLOSE)]
        turn.calls.append(_parse_body(text[pos + len(OPEN) : end], raw))
        pos = text.find(OPEN, end + len(CLOSE))
    for i, c in enumerate(turn.calls):
        if isinstance(c, ParsedCall):
            c.id = f"call_{i}"
    return turn


def format_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """A call in the Hermes JSON style (what scripted policies and the prompt's examples use)."""
    return OPEN + json.dumps({"name": name, "arguments": arguments}) + CLOSE
