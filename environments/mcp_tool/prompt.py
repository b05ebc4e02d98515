"""The system prompt of an MCP tool episode and its worked examples, in two shapes:

- compact (any chat template): how to call a tool (in the configured format) and the tools, one
  signature line each; worked examples as chat turns whose calls are text in that format;
- native (templates that render tools): a short system message, the tools as JSON schemas for the
  template's `tools=` (`tool_schemas`), and worked examples as structured `tool_calls` with `tool`
  results, which the template renders in the model's own syntax.

`resolve_tool_prompt` turns `tool_prompt: auto` (and a native `call_format: auto`) into what the
tokenizer's template supports."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from environments.base import Message
from environments.mcp_tool.examples import find_calculator
from environments.mcp_tool.exposure import spec_of
from environments.toolcalls import format_tool_call, resolve_format
from environments.toolcalls.templates import (
    NATIVE_MARKERS,
    native_call_format,
    renders_tools,
    template_text,
)
from tools.schema import signature

if TYPE_CHECKING:
    from environments.config import EnvironmentConfig
    from environments.tasks.schema import Task, WorkedExample
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


# -- native prompts: the model's own chat template renders the tools ---------------------------

NATIVE_SYSTEM = ("Use the tools when they help. The result of a call comes back in a tool message. "
                 "When you know the answer, write <answer>your answer</answer>.")
"""The system message of a native prompt; the chat template adds the tools and how to call them."""


def tool_schemas(specs: Sequence[ToolSpec]) -> list[dict]:
    """The tools as the `tools=` argument of a chat template: OpenAI-style function schemas."""
    return [{"type": "function",
             "function": {"name": spec.name, "description": summary(spec.description, limit=1000),
                          "parameters": spec.input_schema or {"type": "object", "properties": {}}}}
            for spec in specs]


def call_id(prefix: str, n: int) -> str:
    """A tool-call id: 9 letters and digits (Mistral's template rejects any other shape)."""
    return f"{prefix[:4]:a<4}{n % 100000:05d}"


def native_example_turns(examples: Sequence[WorkedExample],
                         exposed: Callable[[str, str | None], str] = lambda tool, server: tool) -> list[Message]:
    """Worked examples as structured chat turns for the template to render: the question, an
    assistant message with `tool_calls` and a `tool` result (with its call id and name) for each
    step, then the answer."""
    turns: list[Message] = []
    n = 0
    for example in examples:
        turns.append({"role": "user", "content": example.question})
        for step in example.steps:
            n += 1
            name, cid = exposed(step.tool, step.server), call_id("exmp", n)
            turns += [{"role": "assistant", "content": "",
                       "tool_calls": [{"id": cid, "type": "function",
                                       "function": {"name": name, "arguments": dict(step.params)}}]},
                      {"role": "tool", "tool_call_id": cid, "name": name, "content": step.result}]
        turns.append({"role": "assistant", "content": f"<answer>{example.answer}</answer>"})
    return turns


@dataclass
class OpeningPrompt:
    """An episode's opening messages in their three parts (the prompt budget measures each)."""

    system: Message
    """The system message: how to call tools and the tools (compact), or NATIVE_SYSTEM; a system
    message of the task's own is appended to it."""
    examples: list[Message]
    """The worked examples as chat turns."""
    task: list[Message]
    """The task's own messages."""
    chat_tools: list[dict] | None
    """Native prompts: the tools' JSON schemas for the template's `tools=`."""

    @property
    def messages(self) -> list[Message]:
        return [self.system, *self.examples, *self.task]


def opening_prompt(task: Task, specs: Sequence[ToolSpec], examples: Sequence[WorkedExample],
                   config: EnvironmentConfig) -> OpeningPrompt:
    """The opening of an episode of `task` showing the tools `specs` (config's tool prompt and
    call format already resolved for the tokenizer)."""
    def exposed(tool: str, server: str | None) -> str:
        spec = spec_of(tool, server, specs)
        return spec.name if spec is not None else tool

    chat_tools = None
    if config.tool_prompt == "native":
        system, turns = NATIVE_SYSTEM, native_example_turns(examples, exposed)
        chat_tools = tool_schemas(specs)
    else:
        calculator = find_calculator(specs)
        example_call = (format_tool_call(calculator.name, {"expression": "2 + 2"}, config.call_format)
                        if calculator is not None else None)
        system = render_system_prompt(specs, config.call_format, example_call)
        turns = example_turns(examples, config.call_format, exposed)
    task_messages = task.messages()
    if task_messages[0]["role"] == "system":
        system += "\n\n" + task_messages.pop(0)["content"]
    return OpeningPrompt({"role": "system", "content": system}, turns, task_messages, chat_tools)


def resolve_tool_prompt(config: EnvironmentConfig, tokenizer) -> tuple[EnvironmentConfig, str]:
    """`config` with `tool_prompt` resolved to native or compact for this tokenizer's chat template
    (and, for native prompts, `call_format: auto` to the template's syntax), and one line saying
    what was chosen and why. ValueError: `native` asked of a template that renders no tools, or
    whose call syntax cannot be read from it while `call_format` is `auto`."""
    taught = config.call_format if config.call_format != "auto" else "hermes (call_format auto: every format is read)"
    if config.tool_prompt == "compact":
        return config, f"tool prompt: compact (configured); calls taught as {taught}"
    renders = renders_tools(tokenizer)
    detected = native_call_format(template_text(tokenizer))
    markers = ", ".join(f"{marker} ({fmt})" for marker, fmt in NATIVE_MARKERS if fmt)
    if not renders:
        if config.tool_prompt == "native":
            raise ValueError(
                "environment.tool_prompt is 'native' but this model's chat template renders no tools "
                "(it ignores `tools=`); use tool_prompt: compact (or auto), or set environment.chat_template "
                "to a Jinja template that renders tools")
        reason = ("tool prompt: compact (auto: the chat template renders no tools, so they are listed in the "
                  f"system prompt); calls taught as {taught}")
        return config.model_copy(update={"tool_prompt": "compact"}), reason
    fmt = config.call_format if config.call_format != "auto" else detected
    if fmt is None:
        if config.tool_prompt == "native":
            raise ValueError(
                "environment.tool_prompt is 'native' but the call syntax cannot be read from the chat template "
                f"(it writes none of {markers}); set environment.call_format to the syntax the model writes")
        reason = ("tool prompt: compact (auto: the chat template renders tools but writes no call syntax this "
                  f"library reads: none of {markers}); calls taught as {taught}")
        return config.model_copy(update={"tool_prompt": "compact"}), reason
    how = "read from the chat template" if config.call_format == "auto" else "configured"
    return (config.model_copy(update={"tool_prompt": "native", "call_format": fmt}),
            f"tool prompt: native (the chat template renders the tools' JSON schemas); calls parsed as {fmt} ({how})")
