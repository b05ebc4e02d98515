"""One sequence being sampled by an engine (its prompt, tokens, log-probs and stop rules), and a
request waiting for a row of its own."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from grpo.rollout.base import FinishReason, GenerationRequest, GenerationResult, SamplingParams


@dataclass
class LiveSequence:
    ticket: int
    """Which request this row samples (the engine's or its feed's name for it)."""
    prompt_ids: tuple[int, ...]
    sampling: SamplingParams
    session: str = ""
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    # What the engine's cache row holds for this sequence (continuous batching: a finished row
    # can stay parked until its session's next turn extends it; grpo/rollout/hf/live_batch.py).
    cached: int = 0
    """Tokens of prompt_ids + tokens whose keys and values are in the cache row."""
    end_column: int = 0
    """The cache column after the last of them."""
    parked_at: int | None = None
    """The decode step it finished at, while it waits for its session's next turn."""

    def stop_window(self) -> int:
        """Generated tokens that can hold a just-completed stop string: a character is at most 4
        UTF-8 bytes and every token is at least one byte."""
        return 4 * max(len(s) for s in self.sampling.stop_strings) + 2

    def finish_reason_after(self, token: int, tokenizer) -> FinishReason | None:
        """Why the sequence ends with `token` (already appended), or None if it goes on. A stop
        string is looked for in the decoded tail of the generated tokens only (never the prompt):
        the first time it appears, the token that completed it is the last one kept."""
        sampling = self.sampling
        if token in sampling.stop_token_ids:
            return "stop"
        if sampling.stop_strings:
            text = tokenizer.decode(
                self.tokens[-self.stop_window() :],
                skip_special_tokens=False,
                clean_up_tokenization_spaces=False,
            )
            if any(stop in text for stop in sampling.stop_strings):
                return "stop"
        if len(self.tokens) >= sampling.max_new_tokens:
            return "length"
        return None

    def result(self) -> GenerationResult:
        return GenerationResult(
            token_ids=self.tokens,
            behavior_logprobs=self.logprobs,
            finish_reason=self.finish_reason or "length",
            metrics={
                "prompt_tokens": float(len(self.prompt_ids)),
                "completion_tokens": float(len(self.tokens)),
            },
        )


@dataclass
class Joiner:
    """A request waiting for a row: the feed's ticket and the seed of its random stream."""

    ticket: int
    request: GenerationRequest
    seed: int
    arrived: float = 0.0
    """The decode step (of the engine call) at which it arrived."""

    @functools.cached_property
    def prompt(self) -> tuple[int, ...]:
        """The prompt ids as a tuple (a dict key, compared and sliced while it waits)."""
        return tuple(self.request.prompt_ids)

    @property
    def budget(self) -> int:
        return self.request.sampling.max_new_tokens
