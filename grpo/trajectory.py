"""A played episode as the trainer sees it: exact token ids, the loss mask, and rewards."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class CreditSpan:
    """A credit unit the environment scored (environments/turn_credit.py), on its turn's tokens."""

    start: int
    """token_ids index of the turn's first sampled token."""
    end: int
    """One past its last sampled token."""
    score: float
    key: str
    """Units are compared within the group by key (e.g. `progress=2`: two gold steps done before it)."""


@dataclass
class Trajectory:
    task_id: str
    group_id: str
    """Episodes of one task in one step share a group id; advantages are computed per group."""
    token_ids: list[int]
    """Prompt ids, then each turn's sampled ids and each observation's ids, in order."""
    loss_mask: list[int]
    """1 on exactly the tokens the policy sampled, 0 on prompt and observation tokens."""
    behavior_logprobs: list[float]
    """The engine's log-prob of each token where loss_mask is 1, 0.0 elsewhere; len == len(token_ids)."""
    prompt_length: int
    reward: float = 0.0
    """Total episode reward (outcome plus any per-turn rewards)."""
    turn_rewards: list[tuple[int, float]] = field(default_factory=list)
    """(index of the last token of the turn, reward) for rewards given before the end;
    token-level advantages (GAE) place them there, the final reward on the last sampled token."""
    credit: list[CreditSpan] = field(default_factory=list)
    """Per-turn credit units in order (several may share a turn), for the `turn_grpo` estimator;
    empty when the environment gave none. Not part of `reward`."""
    num_turns: int = 0
    num_tool_calls: int = 0
    finish_reasons: list[str] = field(default_factory=list)
    policy_version: int = 0
    """Updates done on the weights that sampled it (with async rollouts it may lag the trainer's)."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """Reward breakdown, transcript messages, parse/tool error counts, success flag."""

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        if len(self.loss_mask) != n or len(self.behavior_logprobs) != n:
            raise ValueError(
                f"trajectory {self.task_id}: token_ids ({n}), loss_mask ({len(self.loss_mask)}) and "
                f"behavior_logprobs ({len(self.behavior_logprobs)}) must have equal lengths"
            )

    @property
    def num_generated_tokens(self) -> int:
        return sum(self.loss_mask)

    @property
    def success(self) -> bool:
        return bool(self.metadata.get("success", False))
