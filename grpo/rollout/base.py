"""The rollout-engine interface: token ids in, sampled token ids and their log-probs out.

Every backend (HF on CPU/CUDA/MPS, vLLM) implements `RolloutEngine`. The collector hands it a
batch of `GenerationRequest`s (from all live episodes at once) and gets one `GenerationResult`
per request, in order. Engines never see text: prompts are token ids, results are token ids.

An engine that can add requests to a batch it is already decoding (`joins_running_batches`, our
HF engine) also has `serve(feed)`: requests come from a `RequestFeed` while it decodes, join at
the next decode step, and each result is handed back the moment its sequence ends (continuous
batching), so an episode whose turn ended early runs its tool call and asks again while the
others are still generating.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    """0 means greedy."""
    top_p: float = 1.0
    max_new_tokens: int = 128
    stop_token_ids: tuple[int, ...] = ()
    """Sampling one of these ends the sequence; the stop token is included in the result."""
    stop_strings: tuple[str, ...] = ()
    """Decoded text ending in one of these ends the sequence (tokens up to and including the
    token that completed the string are kept)."""
    seed: int | None = None
    """Per-request seed; requests with a seed reproduce exactly regardless of batch company."""


@dataclass
class GenerationRequest:
    prompt_ids: list[int]
    sampling: SamplingParams
    request_id: str = ""
    task_id: str = ""
    """The task of the episode asking (engines that sample ignore it; a scripted one reads it)."""
    turn: int = 0
    """The episode's assistant turn this request generates (0-based)."""
    session: str = ""
    """The conversation (episode) asking: its next turn's prompt extends this one's prompt and
    result, so an engine may keep their keys and values for it (HFEngine.serve does)."""


@dataclass
class GenerationResult:
    token_ids: list[int]
    behavior_logprobs: list[float]
    """Log-prob of each sampled token under softmax(logits / temperature) (temperature 1 when
    greedy), before top-p truncation: the quantity the trainer recomputes. One per token."""
    finish_reason: FinishReason
    metrics: dict[str, float] = field(default_factory=dict)


def check_request(request: GenerationRequest, *, has_tokenizer: bool) -> None:
    """The checks every engine makes before sampling: a prompt, valid sampling parameters, and a
    tokenizer when stop strings must be matched. Raises ValueError naming the request."""
    s = request.sampling
    if not request.prompt_ids:
        raise ValueError(f"request {request.request_id!r} has an empty prompt")
    if s.max_new_tokens < 0 or s.temperature < 0 or not 0 < s.top_p <= 1:
        raise ValueError(f"request {request.request_id!r}: invalid sampling parameters {s}")
    if s.stop_strings and not has_tokenizer:
        raise ValueError("stop_strings need the engine to have a tokenizer")


class RequestFeed(ABC):
    """Where a serving engine takes requests from and hands results back to (thread-safe: the
    engine calls it from its worker thread). Tickets are the feed's names for its requests."""

    @abstractmethod
    def take(
        self, *, close_if_empty: bool, wait_s: float = 0.0
    ) -> list[tuple[int, GenerationRequest]]:
        """Requests that arrived since the last call, as (ticket, request), oldest first.
        `wait_s`: if there are none, wait up to that long for a request or a session end.
        `close_if_empty`: if there are none, the feed closes (later requests go to the next
        `serve` call); the engine asks this only when it has nothing left to decode."""

    def ended_sessions(self) -> list[str]:
        """Sessions that will ask nothing more (their episodes ended) since the last call."""
        return []

    @abstractmethod
    def deliver(self, ticket: int, result: GenerationResult) -> None:
        """The result of one request (each ticket is delivered or failed once)."""

    @abstractmethod
    def fail(self, ticket: int, error: Exception) -> None:
        """One request cannot be generated (e.g. invalid sampling parameters)."""


class RolloutEngine(ABC):
    """Samples continuations of token-id prompts.

    Nothing here assumes the model lives in this process: an engine may be a client of an
    inference server. What a trainer, an evaluator or a bench learns about an engine comes from
    this interface: `describe()` (how it samples, for the run's log and the bench's reports) and
    `last_metrics` (the counters of its last call)."""

    joins_running_batches: bool = False
    """True when `serve` can add requests to a batch it is decoding (continuous batching)."""
    last_metrics: Mapping[str, float] = MappingProxyType({})
    """Counters of the last `generate` or `serve` call (e.g. tokens generated, prefill tokens,
    seconds), summed over a collection by the collector; empty where the engine keeps none."""

    def describe(self) -> dict[str, str]:
        """How this engine samples, as named facts for a log line or a report (e.g. `engine`,
        `device`, `dtype`, `forward`): what the engine knows, whether its model runs here or
        behind a server. The base gives the engine's class name."""
        return {"engine": type(self).__name__}

    def serve(self, feed: RequestFeed) -> None:
        """Generate the feed's requests until it closes, delivering each result as soon as it is
        done; requests that arrive meanwhile join the running batch. Blocking. Only engines with
        `joins_running_batches` implement it."""
        raise NotImplementedError(f"{type(self).__name__} does not serve a request feed")

    @abstractmethod
    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """Sample every request; results come back in request order. Blocking (the collector
        runs it in a worker thread so tool calls proceed meanwhile)."""

    @abstractmethod
    def sync_weights(self, policy) -> None:
        """Make the engine sample from the policy's current weights (after an update)."""

    def sleep(self) -> None:
        """Release accelerator memory while the trainer updates the policy; the next `generate`
        or `sync_weights` takes it back. A no-op unless the engine supports it (vLLM with
        `rollout.vllm.enable_sleep_mode`)."""

    def close(self) -> None:
        """Release engine resources."""
