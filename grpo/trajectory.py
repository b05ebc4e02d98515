"""A played episode as the trainer sees it: exact token ids, the loss mask, and rewards."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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
