"""Call formats that models write natively after a chat template rendered their tools: Mistral's
`[TOOL_CALLS]` list and gpt-oss's harmony messages. (Hermes `<tool_call>` blocks, the Qwen and
SmolLM3 syntax, and Llama 3.1/3.2's bare `{"name": ..., "parameters": ...}` object are the
`hermes` and `json` formats of environments/toolcalls/formats.py.)

Both read the text the way the collector decodes a native turn: special tokens kept (so the
`[TOOL_CALLS]` or `<|channel|>` markers are there), the turn's closing token dropped.
"""

from __future__ import annotations

import json
import re
from typing import ClassVar

from environments.toolcalls.formats import ToolCallFormat, _json_for_tag
from environments.toolcalls.near_json import NearJSONError, read_value_at, snippet
from environments.toolcalls.scan import (
    CALL_EXAMPLE,
    NotACall,
    Scan,
    ToolCall,
    calls_from_object,
    read_values,
)


class Mistral(ToolCallFormat):
    """`[TOOL_CALLS] [{"name": "f", "arguments": {...}}, ...]` (Mistral 7B v0.3, Nemo, Large 2407):
    one marker, then a JSON list of calls (a single object is accepted too). A call's `id`, which
    Mistral's template writes into earlier turns, is ignored."""

    name = "mistral"
    marker: ClassVar[str] = "[TOOL_CALLS]"
    start = re.escape(marker)
    template = '[TOOL_CALLS] [{"name": "<tool>", "arguments": {<arguments>}}]'

    def read(self, scan: Scan, match: re.Match) -> int:
        values, end, failure = read_values(scan.text, match.end())
        scan.markup(match.start(), end)
        if failure is not None:
            scan.error(f"could not parse the {self.marker} list ({failure}); write {self.marker} [{CALL_EXAMPLE}]")
            return max(failure.pos, match.end())
        if not values:
            scan.error(f"{self.marker} must be followed by a JSON list of calls: {self.marker} [{CALL_EXAMPLE}]")
        raw = scan.text[match.start() : end]
        for value in values:
            try:
                scan.result.calls.extend(calls_from_object(value, raw, self.name, strict=True))
            except NotACall as exc:
                scan.error(f"bad {self.marker} call: {exc}")
        return end

    def render(self, name: str, arguments: dict) -> str:
        return f"{self.marker} {json.dumps([{'name': name, 'arguments': arguments}], ensure_ascii=False)}"


_HARMONY_NAME = re.compile(r"functions\.([^\s<]+)")
_HARMONY_MESSAGE = "<|message|>"
_HARMONY_STOPS = ("<|call|>", "<|end|>", "<|start|>")


class Harmony(ToolCallFormat):
    """gpt-oss (harmony): a message addressed `to=functions.NAME`, its JSON arguments after
    `<|message|>`, ended by `<|call|>`. The recipient may stand in the header before the channel
    (`<|start|>assistant to=functions.f<|channel|>commentary json<|message|>{...}<|call|>`, as
    the template writes earlier turns) or after it (`<|channel|>commentary to=functions.f
    <|constrain|>json<|message|>{...}`, as the model usually writes)."""

    name = "harmony"
    start = r"to=functions\."
    template = "<|start|>assistant to=functions.<tool><|channel|>commentary json<|message|>{<arguments>}<|call|>"

    def read(self, scan: Scan, match: re.Match) -> int:
        text = scan.text
        header = _HARMONY_NAME.match(text, match.start() + len("to="))
        name = header.group(1) if header else ""
        body = text.find(_HARMONY_MESSAGE, match.end())
        cut = min((i for i in (text.find(s, match.end()) for s in _HARMONY_STOPS) if i >= 0), default=len(text))
        if not name or body < 0 or body > cut:
            end = cut
            scan.markup(match.start(), end)
            scan.error(f"a harmony call needs to=functions.<name> and its JSON arguments after <|message|>; "
                       f"got {snippet(text[match.start():end])!r}")
            return max(end, match.end())
        pos = body + len(_HARMONY_MESSAGE)
        try:
            arguments, end = read_value_at(text, pos, close_at_end=True)
        except NearJSONError as exc:
            end = max(exc.pos, pos)
            scan.markup(match.start(), end)
            scan.error(f"could not parse the arguments of {name} ({exc}); write <|message|>{{...}}")
            return max(end, match.end())
        if text.startswith("<|call|>", end):
            end += len("<|call|>")
        scan.markup(match.start(), end)
        if not isinstance(arguments, dict):
            scan.error(f"the arguments of {name} must be a JSON object")
        else:
            scan.result.calls.append(ToolCall(name, arguments, text[match.start() : end], self.name))
        return end

    def render(self, name: str, arguments: dict) -> str:
        if not name or any(c.isspace() or c == "<" for c in name):
            raise ValueError(f"harmony cannot express the tool name {name!r}")
        return f"<|start|>assistant to=functions.{name}<|channel|>commentary json<|message|>" \
               f"{_json_for_tag(arguments)}<|call|>"
