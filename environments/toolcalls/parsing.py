"""Tool-call parsing of model text. `parse_tool_calls` never raises.

This module holds the call types (`ToolCall`, `ParseResult`), the scanner with one handler per
kind of markup, and final-answer extraction. The near-JSON reader lives in
`environments.toolcalls.near_json`, reading python-syntax calls in `environments.toolcalls.python_calls`, and writing
calls (`format_tool_call`, `FORMATS`) in `environments.toolcalls.registry`; the public names of those
are re-exported by the package.

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
- `mistral`:  `[TOOL_CALLS] [{"name": "f", "arguments": {...}}, ...]` (Mistral's native syntax).
- `harmony`:  gpt-oss's `to=functions.f ... <|message|>{...}<|call|>` (the recipient before or
  after `<|channel|>`).
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
from typing import Any

from environments.toolcalls.registry import FORMATS
from environments.toolcalls.scan import ParseResult, Scan


def _scan(text: str, formats: frozenset[str], tool_names: frozenset[str] | None) -> Scan:
    scan = Scan(text, formats, tool_names)
    # One alternative per distinct start pattern, named by the first accepted format that has it
    # (json and openai share theirs; the json reader labels each call with its own format).
    readers: dict[str, str] = {}
    for name, fmt in FORMATS.items():
        if name in formats:
            readers.setdefault(fmt.start, name)
    if not readers:
        return scan
    starts = re.compile("|".join(f"(?P<{name}>{start})" for start, name in readers.items()))
    pos = 0
    while pos < len(text):
        m = starts.search(text, pos)
        if m is None:
            break
        pos = max(FORMATS[m.lastgroup].read(scan, m), m.start() + 1)
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
