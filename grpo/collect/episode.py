"""One episode's record: who it is (`task_id_of`), the token sequence built turn by turn
(`EpisodeRecord`: ids, loss mask, behavior log-probs, rewards, transcript), its tool counts
(`episode_stats`) and its conversion to a `Trajectory`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from environments.base import Message, StepResult
from grpo.trajectory import CreditSpan, Trajectory


def task_id_of(task: Any, index: int) -> str:
    """A task's id: `task.id` or `task.task_id`, else `reward_spec.ground_truth.task_id`, else
    `task<index>`."""
    for name in ("id", "task_id"):
        value = getattr(task, name, None)
        if isinstance(value, (str, int)) and value != "":
            return str(value)
    reward_spec = getattr(task, "reward_spec", None)
    ground_truth = getattr(reward_spec, "ground_truth", None)
    value = (
        ground_truth.get("task_id")
        if isinstance(ground_truth, dict)
        else getattr(ground_truth, "task_id", None)
    )
    return str(value) if value not in (None, "") else f"task{index}"


class GroupAbandoned(Exception):
    """Another episode of the group failed for good: this one's result would be dropped anyway."""


@dataclass
class EpisodeStats:
    parse_failures: int = 0
    tool_calls: int = 0
    tool_errors: int = 0


@dataclass
class EpisodeRecord:
    """One episode being played: who it is and the token sequence built so far."""

    task: Any
    task_id: str
    group_id: str
    sample_index: int
    episode_id: str
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    behavior_logprobs: list[float] = field(default_factory=list)
    prompt_length: int = 0
    transcript: list[Message] = field(default_factory=list)
    finish_reasons: list[str] = field(default_factory=list)
    turn_rewards: list[tuple[int, float]] = field(default_factory=list)
    turn_spans: list[tuple[int, int]] = field(default_factory=list)
    """[start, end) token_ids indices of each sampled turn, in order."""
    reward: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)
    done: bool = False
    truncated: bool = False
    """Ended because the next prompt would not fit under rollout.max_total_tokens."""

    @property
    def num_turns(self) -> int:
        return len(self.finish_reasons)

    def start(self, prompt_ids: list[int], messages: list[Message], max_total_tokens: int) -> None:
        if len(prompt_ids) >= max_total_tokens:
            raise ValueError(
                f"task {self.task_id}: the prompt is {len(prompt_ids)} tokens, which leaves no "
                "room "
                f"under rollout.max_total_tokens={max_total_tokens}"
            )
        self.prompt_length = len(prompt_ids)
        self.token_ids = list(prompt_ids)
        self.loss_mask = [0] * len(prompt_ids)
        self.behavior_logprobs = [0.0] * len(prompt_ids)
        self.transcript = list(messages)
        self.prompt_messages = len(messages)

    def add_sampled(self, ids: list[int], logprobs: Sequence[float], finish_reason: str) -> None:
        self.turn_spans.append((len(self.token_ids), len(self.token_ids) + len(ids)))
        self.token_ids += ids
        self.loss_mask += [1] * len(ids)
        self.behavior_logprobs += [float(x) for x in logprobs]
        self.finish_reasons.append(finish_reason)

    def add_observation(self, ids: list[int]) -> None:
        self.token_ids += ids
        self.loss_mask += [0] * len(ids)
        self.behavior_logprobs += [0.0] * len(ids)

    def add_reward(self, outcome: StepResult, *, final: bool) -> None:
        reward = float(outcome.reward)
        self.reward += reward
        self.info = dict(outcome.info or {})
        if reward and not final:
            # A non-final step's reward belongs to the last token of the turn just sampled.
            self.turn_rewards.append((len(self.token_ids) - 1, reward))

    def credit_spans(self) -> list[CreditSpan]:
        """The environment's credit units (final info `turn_credit.units`: [turn, score, key],
        turns 1-based) on their turns' tokens; a unit of a turn that was never sampled raises."""
        credit = self.info.get("turn_credit")
        units = credit.get("units", []) if isinstance(credit, dict) else []
        spans = []
        for turn, score, key in units:
            if not 1 <= int(turn) <= len(self.turn_spans):
                raise ValueError(f"episode {self.episode_id}: a credit unit names turn {turn}, but "
                                 f"{len(self.turn_spans)} turn(s) were sampled")
            start, end = self.turn_spans[int(turn) - 1]
            spans.append(CreditSpan(start, end, float(score), str(key)))
        return spans

    def to_trajectory(self, stats: EpisodeStats) -> Trajectory:
        info = self.info
        metadata = {
            "reward_breakdown": info.get("reward_breakdown", {}),
            "success": bool(info.get("success", False)),
            "done_reason": info.get("done_reason", "max_total_tokens" if self.truncated else None),
            "counts": info.get("counts", {}),
            "transcript": self.transcript,
            "prompt_messages": self.prompt_messages,  # transcript[:n] is the prompt (incl. examples)
            "parse_failures": stats.parse_failures,
            "tool_errors": stats.tool_errors,
            "truncated_total_tokens": self.truncated,
            "episode_id": self.episode_id,
            "sample_index": self.sample_index,
            "info": info,
        }
        return Trajectory(
            task_id=self.task_id,
            group_id=self.group_id,
            token_ids=self.token_ids,
            loss_mask=self.loss_mask,
            behavior_logprobs=self.behavior_logprobs,
            prompt_length=self.prompt_length,
            reward=self.reward,
            turn_rewards=self.turn_rewards,
            credit=self.credit_spans(),
            num_turns=self.num_turns,
            num_tool_calls=stats.tool_calls,
            finish_reasons=list(self.finish_reasons),
            metadata=metadata,
        )


def episode_stats(info: dict[str, Any], transcript: list[Message]) -> EpisodeStats:
    """Counts from the environment's final info (falling back to the transcript for calls)."""
    counts = info.get("counts") if isinstance(info.get("counts"), dict) else info

    def count(*names: str) -> int | None:
        for name in names:
            value = counts.get(name)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return int(value)
        return None

    tool_calls = count("tool_calls", "num_tool_calls")
    if tool_calls is None:
        tool_calls = sum(1 for m in transcript if m.get("role") == "tool")
    return EpisodeStats(
        parse_failures=count("parse_failures", "num_parse_failures") or 0,
        tool_calls=tool_calls,
        tool_errors=count("tool_errors", "num_tool_errors") or 0,
    )
