"""Turn an MCP CallToolResult into the text a model reads: every content block as text, control
characters and terminal escapes removed, line endings unified, long output truncated with a
marker that says how much was cut. Structured content is capped too, keeping its shape."""

from __future__ import annotations

import json
import re
from itertools import islice
from typing import Any

from mcp.types import CallToolResult

# ANSI/VT100 escape sequences (colours, cursor moves) first, so no "[31m" residue remains.
_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")
# C0 controls except tab and newline, DEL, C1 controls.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def clean_text(text: str) -> str:
    if text.isprintable():  # the common short answer: nothing to remove
        return text
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if "\x1b" in text:
        text = _ANSI.sub("", text)
    return _CONTROL.sub("", text)


def truncate(text: str, max_chars: int) -> str:
    """The first `max_chars` characters, then `…[truncated N chars]` when anything was cut.

    A final line that is itself a marker (`…[...]`, as a server writes when it cut its own output,
    e.g. the python server's original output size) is kept after the cut body: otherwise the
    model would never learn how much the server had dropped.
    """
    if len(text) <= max_chars:
        return text
    body, _, last = text.rpartition("\n")
    if body and _is_marker(last) and len(last) <= max_chars // 2:
        budget = max_chars - len(last) - 1
        return f"{body[:budget]}…[truncated {len(body) - budget} chars]\n{last}"
    return f"{text[:max_chars]}…[truncated {len(text) - max_chars} chars]"


def _is_marker(line: str) -> bool:
    return line.startswith("…[") and line.endswith("]") and "\n" not in line


MAX_STRUCTURED_DEPTH = 32
"""Structured content nested deeper is cut there (json.dumps itself fails near 1000 levels)."""


def cap_structured(value: dict, max_chars: int) -> dict:
    """`value` if its JSON fits in `max_chars`, else a copy of the same shape that fits: long
    strings cut like text, long lists and objects cut to their first items, each cut ending in a
    `…[truncated N ...]` marker (an object's as the key `…`)."""
    size = _json_size(value)
    if size is not None and size <= max_chars:
        return value
    limit = max_chars  # the longest string kept; containers keep about limit / 8 items
    while limit >= 1:
        shrunk = _shrink(value, limit, 0)
        shrunk_size = _json_size(shrunk)
        if shrunk_size is not None and shrunk_size <= max_chars:
            return shrunk
        # Aim just under the budget next time; always shrink by at least one.
        limit = min(limit - 1, int(limit * max_chars / (shrunk_size or 2 * max_chars) * 0.9))
    what = f"{size} chars" if size is not None else "nested too deep for JSON"
    return {"…": f"[structured content truncated: {what}]"}


def _json_size(value: Any) -> int | None:
    try:
        return len(json.dumps(value, ensure_ascii=False, default=str))
    except (RecursionError, ValueError):
        return None


def _shrink(value: Any, limit: int, depth: int) -> Any:
    if isinstance(value, str):
        return truncate(value, limit)
    if not isinstance(value, (list, dict)):
        return value
    if depth >= MAX_STRUCTURED_DEPTH:
        return f"…[truncated: nested deeper than {MAX_STRUCTURED_DEPTH} levels]"
    items = max(1, limit // 8)
    if isinstance(value, list):
        kept = [_shrink(item, limit, depth + 1) for item in value[:items]]
        if len(value) > items:
            kept.append(f"…[truncated {len(value) - items} items]")
        return kept
    kept_dict = {key: _shrink(item, limit, depth + 1) for key, item in islice(value.items(), items)}
    if len(value) > items:
        kept_dict["…"] = f"[truncated {len(value) - items} keys]"
    return kept_dict


def _block_text(block: Any) -> str:
    kind = getattr(block, "type", None)
    if kind == "text":
        return block.text
    if kind in ("image", "audio"):
        return f"[{kind}: {getattr(block, 'mime_type', 'unknown type')}]"
    if kind == "resource":
        resource = block.resource
        text = getattr(resource, "text", None)
        return text if text is not None else f"[resource: {resource.uri}]"
    if kind == "resource_link":
        return f"[resource link: {block.uri}]"
    return f"[{kind or type(block).__name__} content]"


def result_text(result: CallToolResult) -> str:
    """All content blocks joined by newlines; the structured content as JSON if there are none."""
    if len(result.content) == 1:
        return _block_text(result.content[0])
    if result.content:
        return "\n".join(_block_text(block) for block in result.content)
    if result.structured_content is not None:
        return json.dumps(result.structured_content, ensure_ascii=False)
    return ""


def normalise(
    result: CallToolResult, max_chars: int, max_structured_chars: int
) -> tuple[str, dict | None]:
    """(model-facing text, structured content or None), both capped."""
    structured = result.structured_content if isinstance(result.structured_content, dict) else None
    if structured is not None:
        structured = cap_structured(structured, max_structured_chars)
    return truncate(clean_text(result_text(result)), max_chars), structured
