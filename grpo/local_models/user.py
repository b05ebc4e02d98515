"""The `local` backend of τ²'s simulated user: a Hugging Face causal LM on this machine, sampled by
our own HFEngine. environments/tau2/user.py defines the interface; environments never import
grpo, so importing this module registers the backend there (`user.backend: local`).

The model is loaded once per process and configuration (`LocalUserModel.from_config` caches it):
the user is a fixed model, separate from the policy being trained, so training never moves it.
Concurrent episodes' user turns are gathered into one engine call (a small batcher on the running
event loop; the engine runs in a worker thread so tool calls and the policy's generation go on).
"""

from __future__ import annotations

import asyncio
import threading

from environments.tau2.config import Tau2UserConfig
from environments.tau2.user import TextUserModel, register_user_model
from grpo.collect import chat_tokens
from grpo.models.devices import compute_dtype, resolve_device
from grpo.models.source import load_causal_lm, load_tokenizer
from grpo.rollout.base import GenerationRequest, GenerationResult, SamplingParams
from grpo.rollout.hf.engine import HFEngine

_MODELS: dict[str, LocalUserModel] = {}
"""Per process: the loaded user models by configuration."""
_LOADING = threading.Lock()


class LocalUserModel(TextUserModel):
    """Writes the user's messages with `engine` (see the module doc)."""

    def __init__(self, engine: HFEngine, tokenizer, config: Tau2UserConfig, batch_wait_s: float = 0.02):
        self.engine = engine
        self.tokenizer = tokenizer
        self.sampling = SamplingParams(temperature=config.temperature, max_new_tokens=config.max_new_tokens,
                                       stop_token_ids=chat_tokens.stop_token_ids(tokenizer))
        self.batch_wait_s = batch_wait_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: list[tuple[GenerationRequest, asyncio.Future]] = []
        self._draining: asyncio.Task | None = None

    @classmethod
    def from_config(cls, config: Tau2UserConfig) -> LocalUserModel:
        key = config.model_dump_json()
        with _LOADING:  # episodes starting together (in worker threads) load the model once
            if key not in _MODELS:
                _MODELS[key] = cls._load(config)
            return _MODELS[key]

    @classmethod
    def _load(cls, config: Tau2UserConfig) -> LocalUserModel:
        device = resolve_device(config.device)[0]
        tokenizer = load_tokenizer(config.name_or_path)
        model = load_causal_lm(config.name_or_path, tokenizer=tokenizer)
        engine = HFEngine(model, tokenizer, device=device, dtype=compute_dtype(device, "auto"))
        return cls(engine, tokenizer, config)

    async def generate_text(self, messages: list[dict]) -> str:
        request = GenerationRequest(chat_tokens.prompt_ids(self.tokenizer, messages), self.sampling, "user")
        result = await self._submit(request)
        return self.tokenizer.decode(result.token_ids, skip_special_tokens=True)

    async def _submit(self, request: GenerationRequest) -> GenerationResult:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # a new event loop (a new collection run): start afresh
            self._loop, self._pending, self._draining = loop, [], None
        future = loop.create_future()
        self._pending.append((request, future))
        if self._draining is None or self._draining.done():
            self._draining = loop.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        while self._pending:
            await asyncio.sleep(self.batch_wait_s)  # let other episodes' user turns join the batch
            batch, self._pending = self._pending, []
            try:
                results = await asyncio.to_thread(self.engine.generate, [request for request, _ in batch])
            # An engine failure fails those turns (their episodes retry), not the batcher.
            except Exception as exc:  # noqa: BLE001
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for (_, future), result in zip(batch, results):
                if not future.done():
                    future.set_result(result)


register_user_model("local", LocalUserModel.from_config)
