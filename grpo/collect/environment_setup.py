"""What the collector does around environments besides playing them: fit the environment config
to the tokenizer before any episode starts (`prepare_environment`), and give groups their judge
scores once all of their episodes have finished (`judge_groups`, for group-relative judging).

Importing this module registers the local judge backend (grpo/local_models/judge.py) and the
local backend of τ²'s simulated user (grpo/local_models/user.py), so every collector can
play `tau2` episodes with `environment.tau2.user.backend: local`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpo.local_models.judge  # (registers judge.backend `local`)
import grpo.local_models.user  # noqa: F401  (registers τ²'s environment.tau2.user.backend `local`)
from environments.config import EnvironmentConfig
from environments.judge.judge import Judge, get_judge
from environments.mcp_tool.prompt import resolve_tool_prompt
from environments.rewards import RewardBreakdown, RewardError, with_judge_score
from environments.tasks.schema import Task
from environments.tau2.user import make_user_model
from grpo.collect import chat_tokens
from grpo.trajectory import Trajectory

log = logging.getLogger("mcp_grpo.collector")


def prepare_environment(config: EnvironmentConfig, tokenizer) -> EnvironmentConfig:
    """The environment config this tokenizer plays with: `chat_template` installed on the
    tokenizer (the run's tokenizer then renders, and saves, that template), `tool_prompt: auto`
    and a native `call_format: auto` resolved from the template, the choice logged with whether
    the template re-renders earlier turns. An OpenAI-compatible judge (and τ²'s OpenAI-compatible
    simulated user) is built now, so that a missing key variable stops the run before any episode
    instead of failing every group.
    Raises ValueError for a combination the template cannot serve."""
    if config.chat_template:
        tokenizer.chat_template = Path(config.chat_template).read_text(encoding="utf-8")
    resolved, reason = resolve_tool_prompt(config, tokenizer)
    log.info("%s", reason)
    if not chat_tokens.prefix_preserving(tokenizer):
        log.info("the chat template renders earlier turns differently once later messages follow (e.g. "
                 "it drops past <think> blocks): trajectories keep exactly the tokens each turn was "
                 "sampled from, and observations are appended as deltas; history is never re-rendered")
    if config.judge.backend == "openai":
        get_judge(config.judge)
    if config.env_class == "tau2" and config.tau2.user.backend == "openai":
        make_user_model(config.tau2.user)  # likewise for τ²'s simulated user
    return resolved


def _pending(trajectory: Trajectory) -> dict | None:
    return trajectory.metadata.get("info", {}).get("judge_pending")


async def judge_group(task: Any, group: list[Trajectory], config: EnvironmentConfig, judge: Judge | None) -> None:
    """Group-relative judging: when the group's episodes left their judge score pending, show
    them to the judge together and put each score into its trajectory (reward, breakdown,
    success). Raises RewardError when the judge fails; the caller excludes the group."""
    pending = [_pending(t) for t in group]
    if not any(pending):
        return
    if not all(pending):
        raise RewardError("only some episodes of the group left their judge score pending")
    judge = judge or await asyncio.to_thread(get_judge, config.judge)  # a local model loads off the loop
    task = task if isinstance(task, Task) else Task.from_record(task, f"task of group {group[0].group_id}")
    verdicts = await judge.score_group(pending[0]["rubric"], [p["transcript"] for p in pending])
    for trajectory, verdict in zip(group, verdicts):
        info = trajectory.metadata["info"]
        before = RewardBreakdown(info["reward"], dict(info["reward_breakdown"]), bool(info["success"]),
                                 dict(info.get("checks", {})))
        after = with_judge_score(task, before, verdict.score, config)
        trajectory.reward += after.total - before.total
        info.update(reward=after.total, reward_breakdown=after.components, success=after.success,
                    checks=after.checks, judge={"score": verdict.score, "reason": verdict.reason})
        info.pop("judge_pending")
        trajectory.metadata.update(reward_breakdown=after.components, success=after.success)


async def judge_groups(tasks: Sequence[Any], groups: list[list[Any]], config: EnvironmentConfig,
                       judge: Judge | None) -> dict[int, RewardError]:
    """`judge_group` for every group whose episodes all finished (concurrently); the groups whose
    judging failed, by index. Other exceptions are bugs and propagate."""
    complete = [i for i, group in enumerate(groups) if not any(isinstance(o, BaseException) for o in group)]
    outcomes = await asyncio.gather(*(judge_group(tasks[i], groups[i], config, judge) for i in complete),
                                    return_exceptions=True)
    failed: dict[int, RewardError] = {}
    for i, outcome in zip(complete, outcomes):
        if isinstance(outcome, RewardError):
            failed[i] = outcome
        elif isinstance(outcome, BaseException):
            raise outcome
    return failed
