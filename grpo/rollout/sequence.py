"""One sequence being sampled by an engine: its tokens, log-probs, random seed and stop rules."""

from __future__ import annotations

from dataclasses import dataclass, field

from grpo.rollout.base import FinishReason, GenerationRequest, GenerationResult, SamplingParams


@dataclass
class LiveSequence:
    request_index: int
    sampling: SamplingParams
    seed: int
    """The request's random stream (grpo/rollout/sampling.py `counter_uniforms`)."""
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: FinishReason | None = None

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

    def result(self, requests: list[GenerationRequest]) -> GenerationResult:
        prompt_tokens = len(requests[self.request_index].prompt_ids)
        return GenerationResult(
            token_ids=self.tokens,
            behavior_logprobs=self.logprobs,
            finish_reason=self.finish_reason or "length",
            metrics={
                "prompt_tokens": float(prompt_tokens),
                "completion_tokens": float(len(self.tokens)),
            },
        )
