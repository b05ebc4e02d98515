"""The judge's backends behind one interface: `JudgeModel.complete(messages) -> str` (the reply
to a chat of {"role", "content"} messages).

- `openai` (here): any OpenAI-compatible endpoint, through the small httpx client τ²'s user
  backend uses (environments/endpoint.py); a missing key variable is an error naming it.
- `local`: a causal LM on this machine through our own engine; it lives in grpo
  (grpo/local_models/judge.py) and registers itself with `register_judge_model`, since
  environments never import grpo.
- `ScriptedJudgeModel`: fixed replies, for tests.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Callable

from environments.endpoint import OpenAIEndpoint
from environments.judge.config import JudgeConfig


class JudgeModel(ABC):
    """Writes the judge's reply to a chat."""

    @abstractmethod
    async def complete(self, messages: list[dict]) -> str: ...


class OpenAIJudgeModel(JudgeModel):
    """The judge played by an OpenAI-compatible endpoint (`judge.base_url`, `judge.model`, the key
    in the variable `judge.api_key_env`, read when the model is built)."""

    def __init__(self, config: JudgeConfig):
        self.endpoint = OpenAIEndpoint(config.base_url, config.model, config.api_key_env, config.timeout)
        self.temperature = config.temperature

    async def complete(self, messages: list[dict]) -> str:
        message = await self.endpoint.acomplete(messages, None, self.temperature)
        return message.get("content") or ""


class ScriptedJudgeModel(JudgeModel):
    """Replies in order; a reply may be a string, an exception (raised), or a callable of the chat
    returning a string. `delay_s` makes every reply slow (to test timeouts). Records the chats it
    was shown in `seen`."""

    def __init__(self, replies: list, delay_s: float = 0.0):
        self.replies = list(replies)
        self.delay_s = delay_s
        self.seen: list[list[dict]] = []

    async def complete(self, messages: list[dict]) -> str:
        self.seen.append(messages)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if not self.replies:
            raise RuntimeError("the scripted judge has no reply left")
        reply = self.replies.pop(0)
        if isinstance(reply, BaseException):
            raise reply
        return reply(messages) if callable(reply) else reply


JUDGE_MODELS: dict[str, Callable[[JudgeConfig], JudgeModel]] = {"openai": OpenAIJudgeModel}
"""Judge backends by `judge.backend`; grpo registers `local`."""


def register_judge_model(backend: str, factory: Callable[[JudgeConfig], JudgeModel]) -> None:
    JUDGE_MODELS[backend] = factory


def make_judge_model(config: JudgeConfig) -> JudgeModel:
    factory = JUDGE_MODELS.get(config.backend)
    if factory is None:
        if config.backend == "local":
            raise ValueError("judge.backend 'local' runs a model through grpo's engine; it is registered by "
                             "grpo.local_models.judge (imported by the trajectory collector)")
        raise ValueError(f"unknown judge.backend {config.backend!r}; registered: {', '.join(sorted(JUDGE_MODELS))}")
    return factory(config)
