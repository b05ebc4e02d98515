"""Writing tool calls: `format_tool_call(name, arguments, format)` and the list of `FORMATS`.

Each format's text is what `environments.toolcalls.parsing.parse_tool_calls` reads back to exactly the same
name and arguments (see that module's docstring for the formats).
"""

from __future__ import annotations

import json
from typing import Any

from environments.toolcalls.near_json import LITERAL_WORDS
from environments.toolcalls.python_calls import python_literal

FORMATS: tuple[str, ...] = ("hermes", "tool_tag", "json", "openai", "react", "python")
"""Every call format the parser reads and `format_tool_call` writes."""


def _json_for_tag(obj: Any) -> str:
    # "</" written as "<\/" (valid JSON) so a string can never close the tag early.
    return json.dumps(obj, ensure_ascii=False).replace("</", "<\\/")


def format_tool_call(name: str, arguments: dict, format: str = "hermes") -> str:
    """The text of one call in `format` (`auto` means `hermes`); `parse_tool_calls` reads it back
    to exactly `name` and `arguments`. Raises ValueError for a call the format cannot express."""
    fmt = "hermes" if format == "auto" else format
    call = {"name": name, "arguments": arguments}
    if fmt == "hermes":
        # One line: the form measured to work best as SmolLM2's in-context example.
        return f"<tool_call>{_json_for_tag(call)}</tool_call>"
    if fmt == "tool_tag":
        return f"<tool>{_json_for_tag(call)}</tool>"
    if fmt == "json":
        return json.dumps(call, ensure_ascii=False)
    if fmt == "openai":
        function = {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}
        return json.dumps({"tool_calls": [{"type": "function", "function": function}]}, ensure_ascii=False)
    if fmt == "react":
        if "\n" in name or not name.strip() or name != name.strip():
            raise ValueError(f"react cannot express the tool name {name!r}")
        return f"Action: {name}\nAction Input: {json.dumps(arguments, ensure_ascii=False)}"
    if fmt == "python":
        if not all(part.isidentifier() for part in name.split(".")):
            raise ValueError(f"python cannot express the tool name {name!r}")
        bad = [k for k in arguments if not (isinstance(k, str) and k.isidentifier()) or k in LITERAL_WORDS]
        if bad:
            raise ValueError(f"python cannot express the argument names {bad!r}")
        args = ", ".join(f"{k}={python_literal(v)}" for k, v in arguments.items())
        return f"```python\n{name}({args})\n```"
    raise ValueError(f"unknown call format {format!r}; choose one of: {', '.join(FORMATS)}, auto")
