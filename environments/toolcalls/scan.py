"""The state of one scan over model text and the readers every JSON-shaped format shares.

`ToolCall` and `ParseResult` are what parsing returns. `Scan` collects calls, errors and the spans
of consumed markup as the formats' readers (environments/toolcalls/formats.py) walk the text;
`calls_from_object` turns a parsed JSON object (or list) into calls; `read_values` and
`read_region` read the JSON values inside a tag.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from environments.toolcalls.near_json import NearJSONError, NearJSONReader, loads_near_json
from environments.toolcalls.python_calls import python_calls


@dataclass
class ToolCall:
    name: str
    arguments: Any
    """Usually a dict; anything else (e.g. an unparseable string) is the environment's to reject."""
    raw: str
    """The text the call was read from."""
    format: str


@dataclass
class ParseResult:
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    """One readable message per piece of tool-call markup that could not be read."""
    final_answer: str | None = None
    had_markup: bool = False
    """Tool-call markup was present (whether or not it parsed)."""



@dataclass
class Scan:
    text: str
    formats: frozenset[str]
    tool_names: frozenset[str] | None = None
    result: ParseResult = field(default_factory=ParseResult)
    spans: list[tuple[int, int]] = field(default_factory=list)
    """Consumed markup spans; the final answer is never read inside them."""

    def markup(self, start: int, end: int) -> int:
        self.result.had_markup = True
        self.spans.append((start, end))
        return end

    def error(self, message: str) -> None:
        self.result.errors.append(message)


STRAY = " \t\r\n}]),;."



CALL_SHAPE_HINT = re.compile(r"""\{\s*["']?(?:name|tool_calls|function)["']?\s*:""")
CALL_EXAMPLE = '{"name": "<tool name>", "arguments": {...}}'


class NotACall(Exception):
    """The object is not shaped like a tool call (message says why)."""


def _arguments_of(obj: dict) -> Any:
    for key in ("arguments", "parameters"):
        if key in obj:
            args = obj[key]
            if isinstance(args, str):
                # OpenAI puts the arguments in a JSON string; small models copy that elsewhere.
                stripped = args.strip()
                if not stripped:
                    return {}
                try:
                    parsed = loads_near_json(stripped)
                except NearJSONError:
                    return args
                return parsed if isinstance(parsed, dict) else args
            return {} if args is None else args
    return {}


def calls_from_object(obj: Any, raw: str, fmt: str, strict: bool) -> list[ToolCall]:
    """Calls described by a parsed object. `strict` (inside explicit tool markup): a shapeless
    object raises `NotACall` with the reason; otherwise (bare JSON in prose) it gives []."""
    if isinstance(obj, list):
        if not obj or not all(isinstance(item, dict) for item in obj):
            if strict:
                raise NotACall(f"expected a call object {CALL_EXAMPLE} or a list of them")
            return []
        calls: list[ToolCall] = []
        for item in obj:
            calls.extend(calls_from_object(item, raw, fmt, strict))
        return calls
    if not isinstance(obj, dict):
        if strict:
            raise NotACall(f"expected a call object {CALL_EXAMPLE}, got {type(obj).__name__}")
        return []
    if isinstance(obj.get("tool_calls"), list):
        fmt = "openai" if fmt == "json" else fmt
        return calls_from_object(obj["tool_calls"], raw, fmt, strict=True) if obj["tool_calls"] else []
    if isinstance(obj.get("function"), dict):
        fmt = "openai" if fmt == "json" else fmt
        return calls_from_object(obj["function"], raw, fmt, strict=True)
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        if strict:
            raise NotACall(f'a tool call needs a "name" string: {CALL_EXAMPLE}')
        return []
    has_arguments = "arguments" in obj or "parameters" in obj
    if not strict and not has_arguments and set(obj) != {"name"}:
        return []  # data that happens to have a "name", e.g. {"name": "Ada", "age": 36}
    return [ToolCall(name=name.strip(), arguments=_arguments_of(obj), raw=raw, format=fmt)]


def read_values(text: str, pos: int) -> tuple[list[Any], int, NearJSONError | None]:
    """Consecutive JSON values from `pos` (separated by whitespace or commas)."""
    reader = NearJSONReader(text)
    values: list[Any] = []
    while True:
        pos = reader.skip_ws(pos)
        if pos >= len(text) or text[pos] not in "{[":
            return values, pos, None
        try:
            value, pos = reader.value(pos)
        except NearJSONError as exc:
            return values, pos, exc
        values.append(value)
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1


def read_region(region: str) -> tuple[list[Any], NearJSONError | None]:
    """The values in a tag's region, brackets left open at its end closed; one value, or one
    per line."""
    if not region.strip():
        return [], None
    try:
        return [loads_near_json(region.strip(), close_at_end=True)], None
    except NearJSONError as exc:
        lines = [line.strip() for line in region.splitlines() if line.strip()]
        if len(lines) > 1:
            try:
                return [loads_near_json(line, close_at_end=True) for line in lines], None
            except NearJSONError:
                pass
        entries = python_calls(region.strip())  # e.g. <tool_call>multiply(a=3, b=4)</tool_call>
        if entries and all(e.error is None for e in entries):
            return [{"name": e.name, "arguments": e.arguments} for e in entries], None
        return [], exc
