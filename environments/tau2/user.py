"""The simulated user of τ² episodes: τ²'s user prompting and stop signals, answered by a model
behind one interface.

`SimulatedUser` follows τ²'s `UserSimulator`: its system prompt is τ²'s (the global simulation
guidelines, the tools variant when the domain gives the user tools, and the task's user scenario
with its instructions and known/unknown information); the conversation is kept as τ²'s `UserState`
and shown to the model with roles flipped (the user simulator is the "assistant" of its own chat);
a reply containing `###STOP###`, `###TRANSFER###` or `###OUT-OF-SCOPE###` ends the conversation
(τ²'s `UserSimulator.is_stop`). Replies are τ² `UserMessage`s (tool calls with requestor "user").

`UserModel` is the interface a backend implements: `complete(messages, tools) -> UserReply`.
Backends, chosen by `environment.tau2.user.backend` through `make_user_model`:

- `openai` (here): any OpenAI-compatible endpoint, tools passed natively;
- `local`: a causal LM on this machine through our own engine; it lives in grpo
  (grpo/local_models/user.py, a `TextUserModel`) and registers itself with
  `register_user_model`, since environments never import grpo.

`TextUserModel` adapts a text-only model: the user's tools are listed in its system message with
how to call them, earlier calls are written as Hermes `<tool_call>` blocks, and calls are parsed
back from its text. `ScriptedUserModel` replays fixed replies (tests, gold replays).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from environments.endpoint import OpenAIEndpoint
from environments.tau2 import official
from environments.tau2.config import Tau2UserConfig
from environments.toolcalls import format_tool_call, parse_tool_calls
from tools.schema import signature

STOP = "###STOP###"


@dataclass
class UserReply:
    content: str | None
    tool_calls: list[tuple[str, dict]] = field(default_factory=list)


class UserModel(ABC):
    """Writes the simulated user's next message, given its chat (OpenAI-style dicts: system, then
    the agent's messages as "user" and the simulator's own as "assistant", tool results as "tool")
    and the user's tool schemas ({"name", "description", "parameters"}; often none)."""

    @abstractmethod
    async def complete(self, messages: list[dict], tools: list[dict]) -> UserReply: ...


# -- text-only models --------------------------------------------------------------------------

def _tool_lines(tools: list[dict]) -> list[str]:
    return [f"- {signature(tool['name'], tool.get('parameters'))}: {' '.join(tool.get('description', '').split())}"
            for tool in tools]


def as_text_chat(messages: list[dict], tools: list[dict]) -> list[dict]:
    """The chat for a model without native tools: tools described in the system message, earlier
    calls written as `<tool_call>` blocks in the assistant's text."""
    out = []
    for message in messages:
        content = message.get("content") or ""
        if message["role"] == "system" and tools:
            example = format_tool_call("<tool name>", {"<argument>": "<value>"}, "hermes")
            content += "\n\nYou can use these tools on your device. To use one, write:\n" + example
            content += "\n" + "\n".join(_tool_lines(tools))
        if message.get("tool_calls"):
            calls = [format_tool_call(c["function"]["name"], json.loads(c["function"]["arguments"]), "hermes")
                     for c in message["tool_calls"]]
            content = "\n".join(filter(None, [content, *calls]))
        out.append({"role": message["role"], "content": content})
    return out


def parse_text_reply(text: str, tool_names: list[str]) -> UserReply:
    """A text-only model's reply: `<tool_call>` blocks for tools it was given, the rest as text."""
    if not tool_names:
        return UserReply(text.strip() or None)
    parsed = parse_tool_calls(text, formats=["hermes"], tool_names=tool_names)
    calls = [(c.name, c.arguments) for c in parsed.calls if isinstance(c.arguments, dict)]
    rest = text
    for call in parsed.calls:
        rest = rest.replace(call.raw, "")
    return UserReply(rest.strip() or None, calls)


class TextUserModel(UserModel):
    """A model that writes plain text (see `as_text_chat`); subclasses implement `generate_text`."""

    async def complete(self, messages: list[dict], tools: list[dict]) -> UserReply:
        text = await self.generate_text(as_text_chat(messages, tools))
        return parse_text_reply(text, [tool["name"] for tool in tools])

    @abstractmethod
    async def generate_text(self, messages: list[dict]) -> str:
        """The model's reply to a chat of {"role", "content"} messages."""


# -- the openai and scripted backends ----------------------------------------------------------

class OpenAIUserModel(UserModel):
    """The user played by an OpenAI-compatible endpoint (`user.base_url`, `user.model`, the key in
    the variable `user.api_key_env`)."""

    def __init__(self, config: Tau2UserConfig):
        self.endpoint = OpenAIEndpoint(config.base_url, config.model, config.api_key_env, config.timeout)
        self.temperature = config.temperature

    async def complete(self, messages: list[dict], tools: list[dict]) -> UserReply:
        message = await self.endpoint.acomplete(messages, tools or None, self.temperature)
        calls = []
        for call in message.get("tool_calls") or []:
            arguments = call["function"].get("arguments") or "{}"
            try:
                arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
            except ValueError:
                arguments = {}  # a malformed call still runs, and τ²'s tool answers with its error
            calls.append((call["function"]["name"], arguments if isinstance(arguments, dict) else {}))
        return UserReply(message.get("content") or None, calls)


class ScriptedUserModel(UserModel):
    """Fixed replies in order (a string, or a list of (tool, arguments) calls); `###STOP###` after
    the last. Records the chats it was shown."""

    def __init__(self, replies: list[str | list[tuple[str, dict]]]):
        self.replies = list(replies)
        self.seen: list[list[dict]] = []

    async def complete(self, messages: list[dict], tools: list[dict]) -> UserReply:
        self.seen.append(messages)
        reply = self.replies.pop(0) if self.replies else STOP
        return UserReply(reply, []) if isinstance(reply, str) else UserReply(None, list(reply))


USER_MODELS: dict[str, Callable[[Tau2UserConfig], UserModel]] = {"openai": OpenAIUserModel}
"""User backends by `user.backend`; grpo registers `local`."""


def register_user_model(backend: str, factory: Callable[[Tau2UserConfig], UserModel]) -> None:
    USER_MODELS[backend] = factory


def make_user_model(config: Tau2UserConfig) -> UserModel:
    factory = USER_MODELS.get(config.backend)
    if factory is None:
        if config.backend == "local":
            raise ValueError("user.backend 'local' runs a model through grpo's engine; it is registered by "
                             "grpo.local_models.user (imported by the trainer and launch.evaluate)")
        raise ValueError(f"unknown user.backend {config.backend!r}; registered: {', '.join(sorted(USER_MODELS))}")
    return factory(config)


# -- the simulator -----------------------------------------------------------------------------

def chat_message(message: Any) -> dict:
    """A τ² message (as `UserState.flip_roles` gives them) as an OpenAI-style dict."""
    out: dict[str, Any] = {"role": message.role, "content": message.content or ""}
    if message.role == "tool":
        out["tool_call_id"] = message.id
    elif getattr(message, "tool_calls", None):
        out["tool_calls"] = [{"id": c.id, "type": "function",
                              "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                             for c in message.tool_calls]
    return out


class SimulatedUser:
    """One episode's user: τ²'s prompt and state over a `UserModel` (see the module doc)."""

    def __init__(self, task: Any, model: UserModel, tools: list[dict], history: list[Any]):
        self.tau2 = official.load()
        sim = self.tau2.user_simulator
        prompt = sim.SYSTEM_PROMPT.format(global_user_sim_guidelines=sim.get_global_user_sim_guidelines(bool(tools)),
                                          instructions=str(task.user_scenario))
        system = self.tau2.message.SystemMessage(role="system", content=prompt)
        self.state = self.tau2.user_base.UserState(system_messages=[system], messages=list(history))
        self.model = model
        self.tools = list(tools)
        self.calls_made = 0

    @property
    def system_prompt(self) -> str:
        return self.state.system_messages[0].content

    def chat(self) -> list[dict]:
        """What the model is shown: τ²'s system prompt, then the conversation with roles flipped."""
        return [chat_message(m) for m in self.state.system_messages + self.state.flip_roles()]

    async def respond(self, incoming: list[Any]) -> Any:
        """The user's next τ² UserMessage after `incoming` (the agent's message, or the results of
        the user's own tool calls)."""
        self.state.messages.extend(incoming)
        reply = await self.model.complete(self.chat(), self.tools)
        ToolCall = self.tau2.message.ToolCall
        calls = []
        for name, arguments in reply.tool_calls:
            self.calls_made += 1
            calls.append(ToolCall(id=f"user_call_{self.calls_made}", name=name, arguments=arguments,
                                  requestor="user"))
        message = self.tau2.message.UserMessage(role="user", content=reply.content, tool_calls=calls or None)
        self.state.messages.append(message)
        return message

    def is_stop(self, message: Any) -> bool:
        """τ²'s stop signals (###STOP###, ###TRANSFER###, ###OUT-OF-SCOPE###)."""
        return self.tau2.user_simulator.UserSimulator.is_stop(message)
