"""Tool-call formats taught in a compact prompt: one class per format, each knowing its name,
where its markup starts, how to read it and how to write a call. The registry (`FORMATS`) is
environments/toolcalls/registry.py; the formats models write natively after their own chat
template (Mistral, harmony) are environments/toolcalls/native_formats.py.

Every format's `render` writes text that `parse_tool_calls` reads back to exactly the same name and
arguments (see environments/toolcalls/parsing.py for what each format accepts).
"""

from __future__ import annotations

import json
import re
from typing import Any, ClassVar

from environments.toolcalls.near_json import LITERAL_WORDS, NearJSONError, read_value_at, snippet
from environments.toolcalls.python_calls import python_calls, python_literal
from environments.toolcalls.scan import (
    CALL_EXAMPLE,
    CALL_SHAPE_HINT,
    STRAY,
    NotACall,
    Scan,
    ToolCall,
    calls_from_object,
    read_region,
    read_values,
)

DEFAULT_FORMAT = "hermes"
"""What `auto` teaches and writes: the form measured to work best as SmolLM2's in-context example."""


def _json_for_tag(obj: Any) -> str:
    # "</" written as "<\/" (valid JSON) so a string can never close the tag early.
    return json.dumps(obj, ensure_ascii=False).replace("</", "<\\/")


class ToolCallFormat:
    """A call format: `name`, the regex `start` of its markup, the `template` a system prompt
    shows, `read` (consume markup at a match of `start`, return where reading stops) and
    `render` (one call as text)."""

    name: ClassVar[str]
    start: ClassVar[str]
    template: ClassVar[str]

    def read(self, scan: Scan, match: re.Match) -> int:
        raise NotImplementedError

    def render(self, name: str, arguments: dict) -> str:
        raise NotImplementedError


# ---------------------------------------------------------------------------------------------
# Tagged JSON: hermes <tool_call>, <tool>

def _tag_block(scan: Scan, start: int, open_tag: str, close_tag: str, fmt: str) -> int:
    text = scan.text
    body_start = start + len(open_tag)
    values, pos, failure = read_values(text, body_start)
    if failure is None and values:
        # Read straight from the text: a string argument may itself contain the closing tag.
        close_at = text.find(close_tag, pos)
        if close_at >= 0 and not text[pos:close_at].strip(STRAY):
            span_end = close_at + len(close_tag)  # stray brackets before the tag are ignored
        else:
            span_end = pos  # never closed: what follows is ordinary text
    else:
        # Read only the tagged region (up to its closing tag, the next opening tag or the end),
        # closing brackets left open at its end.
        close_at = text.find(close_tag, body_start)
        next_open = text.find(open_tag, body_start)
        if close_at >= 0 and (next_open < 0 or close_at < next_open):
            region_end, span_end = close_at, close_at + len(close_tag)
        else:
            region_end = span_end = len(text) if next_open < 0 else next_open
        values, failure = read_region(text[body_start:region_end])
    raw = text[start:span_end]
    scan.markup(start, span_end)
    if failure is not None:
        scan.error(f"could not parse the {open_tag} block ({failure}); write {open_tag}{CALL_EXAMPLE}{close_tag}")
    elif not values:
        scan.error(f"empty {open_tag} block; write {open_tag}{CALL_EXAMPLE}{close_tag}")
    for value in values:
        try:
            scan.result.calls.extend(calls_from_object(value, raw, fmt, strict=True))
        except NotACall as exc:
            scan.error(f"bad {open_tag} block: {exc}")
    return span_end


class _TaggedJSON(ToolCallFormat):
    open_tag: ClassVar[str]
    close_tag: ClassVar[str]

    def read(self, scan: Scan, match: re.Match) -> int:
        return _tag_block(scan, match.start(), self.open_tag, self.close_tag, self.name)

    def render(self, name: str, arguments: dict) -> str:
        return f"{self.open_tag}{_json_for_tag({'name': name, 'arguments': arguments})}{self.close_tag}"


class Hermes(_TaggedJSON):
    name, open_tag, close_tag = "hermes", "<tool_call>", "</tool_call>"
    start = re.escape(open_tag)
    template = '<tool_call>{"name": "<tool>", "arguments": {<arguments>}}</tool_call>'


class ToolTag(_TaggedJSON):
    name, open_tag, close_tag = "tool_tag", "<tool>", "</tool>"
    start = re.escape(open_tag)
    template = '<tool>{"name": "<tool>", "arguments": {<arguments>}}</tool>'


# ---------------------------------------------------------------------------------------------
# Bare JSON and OpenAI's tool_calls object

def _bare_json(scan: Scan, start: int) -> int:
    text = scan.text
    # Only an object is reported when unreadable; a broken list's items are tried one by one.
    looks_like_call = bool(CALL_SHAPE_HINT.match(text, start))
    try:
        value, end = read_value_at(text, start)
    except NearJSONError as exc:
        if not looks_like_call:
            # Past a too-deep nest at once: retrying from each inner bracket would be quadratic.
            return exc.pos if exc.too_deep else start + 1
        if exc.at_end:
            try:
                value, end = read_value_at(text, start, close_at_end=True)
            except NearJSONError as exc2:
                exc = exc2
            else:
                return _bare_json_value(scan, start, end, value, looks_like_call)
        # Resume where reading stopped: a following call may be fine.
        end = max(exc.pos, start + 1)
        scan.markup(start, end)
        scan.error(f"could not parse the tool call {snippet(text[start:end])!r} ({exc}); write {CALL_EXAMPLE}")
        return end
    return _bare_json_value(scan, start, end, value, looks_like_call)


def _bare_json_value(scan: Scan, start: int, end: int, value: Any, looks_like_call: bool) -> int:
    raw = scan.text[start:end]
    try:
        calls = calls_from_object(value, raw, "json", strict=False)
    except NotACall as exc:
        calls = []
        scan.markup(start, end)
        scan.error(f"bad tool call {snippet(raw)!r}: {exc}")
    calls = [c for c in calls if c.format in scan.formats]
    if calls:
        scan.result.calls.extend(calls)
        scan.markup(start, end)
    # Plain data is skipped whole rather than searched for calls inside it.
    return end if isinstance(value, (dict, list)) else start + 1


class BareJSON(ToolCallFormat):
    name = "json"
    start = r"[{\[]"
    template = '{"name": "<tool>", "arguments": {<arguments>}}'

    def read(self, scan: Scan, match: re.Match) -> int:
        # Reads OpenAI-shaped objects too, labelled `openai` (kept only when that is accepted).
        return _bare_json(scan, match.start())

    def render(self, name: str, arguments: dict) -> str:
        return json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)


class OpenAI(BareJSON):
    name = "openai"
    template = '{"tool_calls": [{"type": "function", "function": {"name": "<tool>", "arguments": "{<arguments>}"}}]}'

    def render(self, name: str, arguments: dict) -> str:
        function = {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}
        return json.dumps({"tool_calls": [{"type": "function", "function": function}]}, ensure_ascii=False)


# ---------------------------------------------------------------------------------------------
# ReAct: Action / Action Input

_REACT_INPUT = re.compile(r"[ \t]*\n(?:[ \t]*\n)*[ \t]*Action[ \t]+Input[ \t]*:[ \t]*")


def _react(scan: Scan, match: re.Match) -> int:
    text = scan.text
    start = match.start()
    line_end = text.find("\n", match.end())
    line_end = len(text) if line_end < 0 else line_end
    name = text[match.end() : line_end].strip().strip("`'\"*").strip()
    pos = line_end
    arguments: Any = {}
    answer: str | None = None
    m = _REACT_INPUT.match(text, pos)
    if m:
        pos = m.end()
        rest_end = text.find("\n", pos)
        rest_end = len(text) if rest_end < 0 else rest_end
        if name.lower() in ("final answer", "final_answer", "finish"):
            answer = text[pos:rest_end].strip()
            pos = rest_end
        elif pos < len(text) and text[pos] in "{[":
            try:
                arguments, pos = read_value_at(text, pos)
            except NearJSONError as exc:
                try:
                    arguments, pos = read_value_at(text[:rest_end], pos, close_at_end=True)
                except NearJSONError:
                    end = max(exc.pos, pos + 1)
                    scan.markup(start, end)
                    scan.error(f"could not parse the Action Input of {name!r} ({exc}); write Action Input: {{...}}")
                    return end
        elif text[pos:rest_end].strip():
            value = text[pos:rest_end].strip()
            end = rest_end
            scan.markup(start, end)
            scan.error(f"the Action Input of {name!r} must be a JSON object, got {snippet(value)!r}")
            return end
        else:
            pos = rest_end
    if name.lower() in ("final answer", "final_answer", "finish"):
        scan.spans.append((start, pos))
        if answer is not None:
            scan.result.final_answer = answer
        return max(pos, start + 1)
    scan.markup(start, pos)
    if not name:
        scan.error("an Action line needs a tool name: Action: <tool name>")
        return max(pos, start + 1)
    if not isinstance(arguments, dict):
        scan.error(f"the Action Input of {name!r} must be a JSON object")
        return max(pos, start + 1)
    scan.result.calls.append(ToolCall(name=name, arguments=arguments, raw=text[start:pos], format="react"))
    return max(pos, start + 1)


class ReAct(ToolCallFormat):
    name = "react"
    start = r"(?m:^)[ \t]*Action[ \t]*:"
    template = "Action: <tool>\nAction Input: {<arguments>}"

    def read(self, scan: Scan, match: re.Match) -> int:
        return _react(scan, match)

    def render(self, name: str, arguments: dict) -> str:
        if "\n" in name or not name.strip() or name != name.strip():
            raise ValueError(f"react cannot express the tool name {name!r}")
        return f"Action: {name}\nAction Input: {json.dumps(arguments, ensure_ascii=False)}"


# ---------------------------------------------------------------------------------------------
# Python calls in a fenced block

_FENCE = re.compile(r"```[ \t]*([A-Za-z_]*)[ \t]*\n")
_PYTHON_LANGS = ("python", "py", "tool_code", "")


def _fenced(scan: Scan, match: re.Match) -> int:
    lang = match.group(1).lower()
    if lang not in _PYTHON_LANGS:
        return match.end()  # read inside (e.g. a ```json block holding a call)
    text = scan.text
    close = text.find("```", match.end())
    body_end = len(text) if close < 0 else close
    end = len(text) if close < 0 else close + 3
    entries = python_calls(text[match.end() : body_end])
    if entries is None:
        return match.end()
    if scan.tool_names is not None and not any(e.name in scan.tool_names for e in entries):
        return end  # ordinary code that calls none of the tools
    scan.markup(match.start(), end)
    for entry in entries:
        if entry.error is not None:
            scan.error(entry.error)
        else:
            scan.result.calls.append(ToolCall(entry.name, entry.arguments, entry.source, "python"))
    return end


class Python(ToolCallFormat):
    name = "python"
    start = r"```[ \t]*[A-Za-z_]*[ \t]*\n"
    template = "```python\n<tool>(<argument>=<value>)\n```"

    def read(self, scan: Scan, match: re.Match) -> int:
        return _fenced(scan, _FENCE.match(scan.text, match.start()))

    def render(self, name: str, arguments: dict) -> str:
        if not all(part.isidentifier() for part in name.split(".")):
            raise ValueError(f"python cannot express the tool name {name!r}")
        bad = [k for k in arguments if not (isinstance(k, str) and k.isidentifier()) or k in LITERAL_WORDS]
        if bad:
            raise ValueError(f"python cannot express the argument names {bad!r}")
        args = ", ".join(f"{k}={python_literal(v)}" for k, v in arguments.items())
        return f"```python\n{name}({args})\n```"
