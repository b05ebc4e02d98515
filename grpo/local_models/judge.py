"""The `local` backend of the LLM judge: a Hugging Face causal LM on this machine, sampled by our
own HFEngine. environments/judge/models.py defines the interface; environments never import grpo,
so importing this module registers the backend there (`judge.backend: local`).

It is the same loaded-once, batched engine that plays τ²'s local user
(grpo/local_models/user.py `LocalUserModel`): a fixed model, separate from the policy, whose
concurrent requests (episodes finishing together) are gathered into one engine call.
"""

from __future__ import annotations

from environments.judge.config import JudgeConfig
from environments.judge.models import JudgeModel, register_judge_model
from environments.tau2.config import Tau2UserConfig
from grpo.local_models.user import LocalUserModel


class LocalJudgeModel(JudgeModel):
    """Writes the judge's reply with a local model (see the module doc)."""

    def __init__(self, chat: LocalUserModel):
        self.chat = chat

    @classmethod
    def from_config(cls, config: JudgeConfig) -> LocalJudgeModel:
        engine_config = Tau2UserConfig(backend="local", name_or_path=config.name_or_path, device=config.device,
                                       temperature=config.temperature, max_new_tokens=config.max_new_tokens)
        return cls(LocalUserModel.from_config(engine_config))

    async def complete(self, messages: list[dict]) -> str:
        return await self.chat.generate_text(messages)


register_judge_model("local", LocalJudgeModel.from_config)
