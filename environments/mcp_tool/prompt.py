"""The system prompt of an MCP tool episode: how to call a tool (in the configured format) and
the tools, one compact signature line each, and worked examples as real chat turns."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from environments.base import Message
from environments.toolcalls import format_tool_call, resolve_format
from tools.schema import signature

if TYPE_CHECKING:
    from environments.tasks.schema import WorkedExample
    from tools.manager import ToolSpec


def summary(description: str, limit: int = 160) -> str:
    """The first paragraph of a tool description, on one line and at most `limit` characters."""
    first = (description or "").strip().split("\n\n")[0]
    first = " ".join(first.split())
    return first if len(first) <= limit else first[: limit - 3].rstrip() + "..."


def render_tool(spec: ToolSpec) -> str:
    """`- name(arg: type, opt?: type): description` from the tool's JSON schema."""
    description = summary(spec.description)
    return f"- {signature(spec.name, spec.input_schema)}" + (f": {description}" if description else "")


def render_system_prompt(specs: Sequence[ToolSpec], call_format: str = "auto", example_call: str | None = None) -> str:
    """How to call tools (a concrete call when one is given, else the format's template) and the
    tools."""
    return "\n".join([
        "You can call tools. To call one, write it like this:",
        example_call or resolve_format(call_format).template,
        "The result comes back in a tool message. When you know the answer, write <answer>your answer</answer>.",
        "",
        "Tools:",
        *(render_tool(spec) for spec in specs),
    ])


def example_turns(examples: Sequence[WorkedExample], call_format: str = "auto",
                  exposed: Callable[[str, str | None], str] = lambda tool, server: tool) -> list[Message]:
    """Worked examples as chat turns: the question, then for each step an assistant call (the
    tool under the name the model sees, `exposed(tool, server)`) and its tool result, then the
    answer."""
    turns: list[Message] = []
    for example in examples:
        turns.append({"role": "user", "content": example.question})
        for step in example.steps:
            call = format_tool_call(exposed(step.tool, step.server), step.params, call_format)
            turns += [{"role": "assistant", "content": call}, {"role": "tool", "content": step.result}]
        turns.append({"role": "assistant", "content": f"<answer>{example.answer}</answer>"})
    return turns
