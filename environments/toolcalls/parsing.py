"""Tool-call parsing of model text. `parse_tool_calls` never raises.

This module holds the call types (`ToolCall`, `ParseResult`), the scanner with one handler per
kind of markup, and final-answer extraction. The near-JSON reader lives in
`environments.toolcalls.near_json`, reading python-syntax calls in `environments.toolcalls.python_calls`, and writing
calls (`format_tool_call`, `FORMATS`) in `environments.toolcalls.formats`; the public names of those
are re-exported here.

Accepted tool-call formats (`format` names, as in `EnvironmentConfig.call_format`):

- `hermes`:   `<tool_call>{"name": "f", "arguments": {...}}</tool_call>`; the closing tag may be
  missing at the end of the text (generation often stops right before it). The block may hold
  several call objects or a JSON list of them.
- `tool_tag`: `<tool>{"name": "f", "arguments": {...}}</tool>` (same contents as `hermes`).
- `json`:     a bare `{"name": "f", "arguments": {...}}` anywhere in the text (`"parameters"` is
  accepted for `"arguments"`), or a JSON list of such objects.
- `openai`:   `{"tool_calls": [{"type": "function", "function": {"name": "f",
  "arguments": "<JSON string>"}}]}`; `arguments` may also be an object.
- `react`:    a line `Action: f` followed by `Action Input: {...}` (missing or empty input means
  no arguments). `Action: Final Answer` with `Action Input: X` gives the final answer X.
- `python`:   a fenced block (```python, ```py, ```tool_code or a bare ```) of calls with
  keyword arguments, e.g. `multiply(a=3, b="x")`; arguments must be literals (parsed with `ast`,
  never evaluated). Dotted names (`calculator.multiply`) are kept as written.

Inside JSON, near-JSON is accepted: single-quoted strings, trailing commas, Python
`True`/`False`/`None`, and unquoted identifier keys (`{name: "f"}`). Inside a `<tool_call>` block,
brackets left open at the end of the block are closed.

Final answers: the last `<answer>...</answer>` (closing tag optional at the end of the text),
otherwise the last line starting with `Final answer:` or `Answer:` (case-insensitive; leading
`*`, `#` or `>` markdown allowed; the rest of the line, or the next non-empty line when the rest
is empty). Text inside tool-call markup is never read as an answer.

Markup that is present but cannot be read becomes a readable message in `ParseResult.errors`
(for the model to see) and sets `had_markup`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from environments.toolcalls.near_json import (
    NearJSONError,
    NearJSONReader,
    loads_near_json,
    read_value_at,
    snippet,
)
from environments.toolcalls.python_calls import python_calls
from environments.toolcalls.formats import FORMATS, format_tool_call

__all__ = [
    "FORMATS",
    "NearJSONError",
    "ParseResult",
    "ToolCall",
    "extract_final_answer",
    "format_tool_call",
    "loads_near_json",
    "parse_tool_calls",
]


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


# ---------------------------------------------------------------------------------------------
# Turning objects into calls

_CALL_SHAPE_HINT = re.compile(r"""\{\s*["']?(?:name|tool_calls|function)["']?\s*:""")
_CALL_EXAMPLE = '{"name": "<tool name>", "arguments": {...}}'


class _NotACall(Exception):
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


def _calls_from_object(obj: Any, raw: str, fmt: str, strict: bool) -> list[ToolCall]:
    """Calls described by a parsed object. `strict` (inside explicit tool markup): a shapeless
    object raises `_NotACall` with the reason; otherwise (bare JSON in prose) it gives []."""
    if isinstance(obj, list):
        if not obj or not all(isinstance(item, dict) for item in obj):
            if strict:
                raise _NotACall(f"expected a call object {_CALL_EXAMPLE} or a list of them")
            return []
        calls: list[ToolCall] = []
        for item in obj:
            calls.extend(_calls_from_object(item, raw, fmt, strict))
        return calls
    if not isinstance(obj, dict):
        if strict:
            raise _NotACall(f"expected a call object {_CALL_EXAMPLE}, got {type(obj).__name__}")
        return []
    if isinstance(obj.get("tool_calls"), list):
        fmt = "openai" if fmt == "json" else fmt
        return _calls_from_object(obj["tool_calls"], raw, fmt, strict=True) if obj["tool_calls"] else []
    if isinstance(obj.get("function"), dict):
        fmt = "openai" if fmt == "json" else fmt
        return _calls_from_object(obj["function"], raw, fmt, strict=True)
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        if strict:
            raise _NotACall(f'a tool call needs a "name" string: {_CALL_EXAMPLE}')
        return []
    has_arguments = "arguments" in obj or "parameters" in obj
    if not strict and not has_arguments and set(obj) != {"name"}:
        return []  # data that happens to have a "name", e.g. {"name": "Ada", "age": 36}
    return [ToolCall(name=name.strip(), arguments=_arguments_of(obj), raw=raw, format=fmt)]


# ---------------------------------------------------------------------------------------------
# The scanner: finds markup left to right, each handler consumes its span.


@dataclass
class _Scan:
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


_STRAY = " \t\r\n}]),;."


def _tag_block(scan: _Scan, start: int, open_tag: str, close_tag: str, fmt: str) -> int:
    text = scan.text
    body_start = start + len(open_tag)
    values, pos, failure = _read_values(text, body_start)
    if failure is None and values:
        # Read straight from the text: a string argument may itself contain the closing tag.
        close_at = text.find(close_tag, pos)
        if close_at >= 0 and not text[pos:close_at].strip(_STRAY):
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
        values, failure = _read_region(text[body_start:region_end])
    raw = text[start:span_end]
    scan.markup(start, span_end)
    if failure is not None:
        scan.error(f"could not parse the {open_tag} block ({failure}); write {open_tag}{_CALL_EXAMPLE}{close_tag}")
    elif not values:
        scan.error(f"empty {open_tag} block; write {open_tag}{_CALL_EXAMPLE}{close_tag}")
    for value in values:
        try:
            scan.result.calls.extend(_calls_from_object(value, raw, fmt, strict=True))
        except _NotACall as exc:
            scan.error(f"bad {open_tag} block: {exc}")
    return span_end


def _read_values(text: str, pos: int) -> tuple[list[Any], int, NearJSONError | None]:
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


def _read_region(region: str) -> tuple[list[Any], NearJSONError | None]:
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


def _bare_json(scan: _Scan, start: int) -> int:
    text = scan.text
    # Only an object is reported when unreadable; a broken list's items are tried one by one.
    looks_like_call = bool(_CALL_SHAPE_HINT.match(text, start))
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
        scan.error(f"could not parse the tool call {snippet(text[start:end])!r} ({exc}); write {_CALL_EXAMPLE}")
        return end
    return _bare_json_value(scan, start, end, value, looks_like_call)


def _bare_json_value(scan: _Scan, start: int, end: int, value: Any, looks_like_call: bool) -> int:
    raw = scan.text[start:end]
    try:
        calls = _calls_from_object(value, raw, "json", strict=False)
    except _NotACall as exc:
        calls = []
        scan.markup(start, end)
        scan.error(f"bad tool call {snippet(raw)!r}: {exc}")
    calls = [c for c in calls if c.format in scan.formats]
    if calls:
        scan.result.calls.extend(calls)
        scan.markup(start, end)
    # Plain data is skipped whole rather than searched for calls inside it.
    return end if isinstance(value, (dict, list)) else start + 1


_REACT_INPUT = re.compile(r"[ \t]*\n(?:[ \t]*\n)*[ \t]*Action[ \t]+Input[ \t]*:[ \t]*")


def _react(scan: _Scan, match: re.Match) -> int:
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


_FENCE = re.compile(r"```[ \t]*([A-Za-z_]*)[ \t]*\n")
_PYTHON_LANGS = ("python", "py", "tool_code", "")


def _fenced(scan: _Scan, match: re.Match) -> int:
    lang = match.group(1).lower()
    if lang not in _PYTHON_LANGS or "python" not in scan.formats:
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


_STARTS = re.compile(
    r"(?P<hermes><tool_call>)|(?P<tool_tag><tool>)|(?P<fence>```[ \t]*[A-Za-z_]*[ \t]*\n)"
    r"|(?P<react>(?m:^)[ \t]*Action[ \t]*:)|(?P<json>[{\[])"
)


def _scan(text: str, formats: frozenset[str], tool_names: frozenset[str] | None) -> _Scan:
    scan = _Scan(text, formats, tool_names)
    pos = 0
    while pos < len(text):
        m = _STARTS.search(text, pos)
        if m is None:
            break
        kind = m.lastgroup
        start = m.start()
        if kind == "hermes" and "hermes" in formats:
            pos = _tag_block(scan, start, "<tool_call>", "</tool_call>", "hermes")
        elif kind == "tool_tag" and "tool_tag" in formats:
            pos = _tag_block(scan, start, "<tool>", "</tool>", "tool_tag")
        elif kind == "fence":
            pos = _fenced(scan, _FENCE.match(text, start))
        elif kind == "react" and "react" in formats:
            pos = _react(scan, m)
        elif kind == "json" and formats & {"json", "openai"}:
            pos = _bare_json(scan, start)
        else:
            pos = m.end()
        pos = max(pos, start + 1)
    return scan


# ---------------------------------------------------------------------------------------------
# Final answers

_ANSWER_TAG = re.compile(r"<answer>(.*?)(?:</answer>|\Z)", re.DOTALL | re.IGNORECASE)
_ANSWER_LINE = re.compile(r"(?im)^[ \t>#*_]*(?:final[ \t]+answer|answer)[ \t*_]*:[ \t]*(.*)$")


def _final_answer(text: str) -> str | None:
    tags = _ANSWER_TAG.findall(text)
    if tags:
        return tags[-1].strip()
    matches = list(_ANSWER_LINE.finditer(text))
    if not matches:
        return None
    m = matches[-1]
    answer = m.group(1).strip().strip("*_").strip()
    if answer:
        return answer
    for line in text[m.end() :].splitlines():
        if line.strip():
            return line.strip()
    return ""


def extract_final_answer(text: str) -> str | None:
    """The final answer written in `text` (see the module doc), or None."""
    return _final_answer(text)


# ---------------------------------------------------------------------------------------------
# Public API


def parse_tool_calls(
    text: Any, formats: Iterable[str] | None = None, tool_names: Iterable[str] | None = None
) -> ParseResult:
    """Every tool call in `text`, errors for unreadable markup, and the final answer.

    `formats` restricts which call formats are read (default: all of `FORMATS`). `tool_names`,
    when given, tells python code blocks that call none of these tools (ordinary code) apart
    from tool calls. Never raises: anything unexpected becomes an error message.
    """
    if not isinstance(text, str):
        text = "" if text is None else str(text)
    wanted = frozenset(FORMATS if formats is None else formats) & frozenset(FORMATS)
    try:
        names = None if tool_names is None else frozenset(tool_names)
        scan = _scan(text, wanted, names)
    except RecursionError:
        return ParseResult(errors=["the tool call is nested too deeply to read"], had_markup=True)
    result = scan.result
    masked = list(text)
    for start, end in scan.spans:
        masked[start:end] = "\n" * (end - start)
    answer = _final_answer("".join(masked))
    if answer is not None:
        result.final_answer = answer
    return result
