"""The registry of tool-call formats (`FORMATS`) and the helpers that pick from it.

`auto` means: parse every format, teach and write `DEFAULT_FORMAT`. Adding a format is one class
(environments/toolcalls/formats.py or native_formats.py) and one entry here.
"""

from __future__ import annotations

from environments.toolcalls.formats import (
    DEFAULT_FORMAT,
    BareJSON,
    Hermes,
    OpenAI,
    Python,
    ReAct,
    ToolCallFormat,
    ToolTag,
)
from environments.toolcalls.native_formats import Harmony, Mistral

# Order matters where two formats' markup starts at the same place: `[TOOL_CALLS] [...]` is
# Mistral's, not a bare JSON list, so mistral comes before json.
FORMATS: dict[str, ToolCallFormat] = {
    f.name: f for f in (Hermes(), ToolTag(), Mistral(), Harmony(), BareJSON(), OpenAI(), ReAct(), Python())
}
"""Every call format the parser reads and `format_tool_call` writes, by name."""


def resolve_format(name: str) -> ToolCallFormat:
    """The format named `name` (`auto` is `DEFAULT_FORMAT`); an unknown name lists the options."""
    fmt = FORMATS.get(DEFAULT_FORMAT if name == "auto" else name)
    if fmt is None:
        raise ValueError(f"unknown call format {name!r}; choose one of: {', '.join(FORMATS)}, auto")
    return fmt


def accepted_formats(name: str) -> list[str] | None:
    """The formats a parser reads for the configured `call_format`: every one (None) for `auto`."""
    return None if name == "auto" else [resolve_format(name).name]


def format_tool_call(name: str, arguments: dict, format: str = DEFAULT_FORMAT) -> str:
    """The text of one call in `format` (`auto` means DEFAULT_FORMAT); `parse_tool_calls` reads it
    back to exactly `name` and `arguments`. Raises ValueError for a call the format cannot express."""
    return resolve_format(format).render(name, arguments)
