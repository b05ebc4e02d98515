"""Turn an MCP CallToolResult into the text a model reads: every content block as text, control
characters and terminal escapes removed, line endings unified, long output truncated with a
marker that says how much was cut."""

from __future__ import annotations

import json
import re
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
    """The first `max_chars` characters, then `…[truncated N chars]` when anything was cut."""
    if len(text) <= max_chars:
        return text
    return f"{text[:max_chars]}…[truncated {len(text) - max_chars} chars]"


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


def normalise(result: CallToolResult, max_chars: int) -> tuple[str, dict | None]:
    """(model-facing text, structured content or None)."""
    structured = result.structured_content if isinstance(result.structured_content, dict) else None
    return truncate(clean_text(result_text(result)), max_chars), structured
