"""Reading a `vllm serve` answer to one `/v1/completions` request, checked before it is trusted.

A server is another process, often on another machine: what it sends may be truncated, another
program's JSON, or numbers no sampler could produce. Left unchecked, a token id past the
vocabulary stops the trainer's forward pass with an IndexError, thousands of tokens for a request
of two overrun the episode's budget, and a NaN or positive log-prob stops the update with a
non-finite loss, each far from the answer that caused it. `completion_result` checks every field
the engine uses and raises InvalidAnswer, naming what was wrong; the engine then treats the server
as failed and sends the request elsewhere, as for a dead server.
"""

from __future__ import annotations

import math
from typing import Any

from grpo.rollout.base import GenerationRequest, GenerationResult

LOGPROB_EPSILON = 1e-4
"""How far above 0 a sampled token's log-prob may be: a probability is at most 1, but a log-softmax
in reduced precision can round a near-certain token a little above 0."""


class InvalidAnswer(RuntimeError):
    """An answer that cannot be a completion of the request; the message names what is wrong."""


def completion_result(answer: Any, request: GenerationRequest, vocab_size: int) -> GenerationResult:
    """One `/v1/completions` answer (a single choice) as our GenerationResult; InvalidAnswer when
    any field is missing, mistyped or impossible for this request and vocabulary."""
    choice = _choice(answer)
    token_ids = choice.get("token_ids")
    if not isinstance(token_ids, list):
        raise InvalidAnswer(f"`token_ids` is {_kind(token_ids)}, not a list")
    limit = request.sampling.max_new_tokens
    if len(token_ids) > limit:
        raise InvalidAnswer(f"{len(token_ids)} tokens for a request of at most {limit} (max_new_tokens)")
    for i, token in enumerate(token_ids):
        if not _is_int(token):
            raise InvalidAnswer(f"token {i} is {_kind(token)}, not an integer id")
        if not 0 <= token < vocab_size:
            raise InvalidAnswer(f"token {i} is id {token}, outside the vocabulary [0, {vocab_size})")
    logprobs = choice.get("logprobs")
    logprobs = logprobs.get("token_logprobs") if isinstance(logprobs, dict) else None
    if not isinstance(logprobs, list):
        raise InvalidAnswer("no `logprobs.token_logprobs` list")
    if len(logprobs) != len(token_ids):
        raise InvalidAnswer(f"{len(token_ids)} tokens but {len(logprobs)} log-probs")
    for i, logprob in enumerate(logprobs):
        if not _is_number(logprob) or not math.isfinite(logprob):
            raise InvalidAnswer(f"the log-prob of token {i} is {_kind(logprob)}, not a finite number")
        if logprob > LOGPROB_EPSILON:
            raise InvalidAnswer(f"the log-prob of token {i} is {logprob!r}, above 0 (a probability "
                                "over 1)")
    reason = choice.get("finish_reason")
    if reason not in ("stop", "length"):
        raise InvalidAnswer(f"finish_reason {_kind(reason)}, not 'stop' or 'length'")
    metrics = {"prompt_tokens": float(len(request.prompt_ids)), "completion_tokens": float(len(token_ids))}
    return GenerationResult([int(t) for t in token_ids], [min(float(lp), 0.0) for lp in logprobs],
                            reason, metrics)


def _choice(answer: Any) -> dict:
    if not isinstance(answer, dict):
        raise InvalidAnswer(f"the answer is {_kind(answer)}, not a JSON object")
    choices = answer.get("choices")
    if not isinstance(choices, list) or not choices:
        raise InvalidAnswer(f"`choices` is {_kind(choices)}, not a list of one choice")
    if not isinstance(choices[0], dict):
        raise InvalidAnswer(f"the choice is {_kind(choices[0])}, not an object")
    return choices[0]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _kind(value: Any, chars: int = 60) -> str:
    """A short description of a value for a message: what it is, and its start."""
    if value is None:
        return "missing (null)"
    if isinstance(value, (dict, list)):
        return f"a{'n object' if isinstance(value, dict) else ' list'} of {len(value)}"
    text = repr(value)
    return text if len(text) <= chars else text[:chars] + "…"
