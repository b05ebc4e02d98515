"""What a tokenizer's chat template says about tools: whether it renders tool schemas passed as
`tools=` (`renders_tools`), and which call syntax it teaches (`native_call_format`, read from the
markers the template writes into earlier assistant turns).

Only the template is read; nothing here tokenizes. Token-exact rendering of prompts and
observation deltas is grpo/collect/chat_tokens.py.
"""

from __future__ import annotations

from typing import Any

PROBE_TOOL_NAME = "probe_tool_3f9c1"
PROBE_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": PROBE_TOOL_NAME,
        "description": "A probe.",
        "parameters": {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]},
    },
}
"""A tool no template mentions by itself: if its name shows in the rendering, `tools=` was used."""

NATIVE_MARKERS: tuple[tuple[str, str | None], ...] = (
    ("<parameter=", None),
    ("[TOOL_CALLS]", "mistral"),
    ("<|call|>", "harmony"),
    ("<tool_call>", "hermes"),
    ('"parameters": ', "json"),
)
"""(text in the template, call format), first match wins: XML parameters inside `<tool_call>`
(Qwen3.5/3.6, Qwen3-Coder, Nemotron 3), which no format reads yet (None); Mistral's `[TOOL_CALLS]`; gpt-oss's
harmony recipient; Hermes `<tool_call>` (Qwen2.5, Qwen3, SmolLM3, Hermes); Llama 3.1/3.2's bare
`{"name": ..., "parameters": ...}` object (read by the `json` format). Checked in this order
because a template may mention a later marker in prose."""


def template_text(tokenizer) -> str | None:
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # several named templates: the default one renders chats
        template = template.get("default")
    return template if isinstance(template, str) else None


def renders_tools(tokenizer) -> bool:
    """The chat template puts tool schemas given as `tools=` into the prompt."""
    if template_text(tokenizer) is None:
        return False
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    try:
        text = tokenizer.apply_chat_template(messages, tools=[PROBE_TOOL], tokenize=False, add_generation_prompt=True)
    # A template that rejects tools (or a system message) by raising does not render them.
    except Exception:  # noqa: BLE001
        return False
    return PROBE_TOOL_NAME in text


def native_call_format(template: str | None) -> str | None:
    """The call format the template writes earlier assistant calls in (see NATIVE_MARKERS), or None
    when it writes none that a format reads."""
    for marker, fmt in NATIVE_MARKERS:
        if template and marker in template:
            return fmt
    return None
