"""Tool calls in model text: one class per call format (read, render, name: formats.py for the
compact formats, native_formats.py for Mistral's and harmony), the registry (registry.py), what a
chat template says about tools (templates.py), the scanner that finds calls and final answers
(parsing.py), the call types and shared JSON readers (scan.py), and the near-JSON and Python-call
readers they use."""

from environments.toolcalls.formats import DEFAULT_FORMAT, ToolCallFormat
from environments.toolcalls.parsing import extract_final_answer, parse_tool_calls
from environments.toolcalls.registry import (
    FORMATS,
    accepted_formats,
    format_tool_call,
    resolve_format,
)
from environments.toolcalls.scan import ParseResult, ToolCall

__all__ = [
    "DEFAULT_FORMAT", "FORMATS", "ParseResult", "ToolCall", "ToolCallFormat", "accepted_formats",
    "extract_final_answer", "format_tool_call", "parse_tool_calls", "resolve_format",
]
