"""Dynamic sampling (as DAPO does): groups whose episodes all got the same reward carry no GRPO
signal (nor, with turn_grpo, any credit unit that differs from its key's others:
grpo/algorithm/estimators.py `zero_variance_groups`); they are dropped and new tasks are played instead, one extra round of at most
`max_groups` groups per step."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from grpo.algorithm.estimators import zero_variance_groups
from grpo.trajectory import Trajectory


async def refill(trajectories: list[Trajectory], play: Callable[[int], Awaitable[Any]], max_groups: int
                 ) -> tuple[list[Trajectory], dict[str, float], Any]:
    """Drop zero-variance groups and add the signal-carrying groups of one extra round.

    `play(n)` plays `n` new tasks and returns their CollectResult. Returns the trajectories to
    train on, `rollout/dynamic_*` metrics, and that CollectResult (None when no round ran). When
    nothing would be left the original batch stays (zero advantages then simply train nothing).
    """
    flat = zero_variance_groups(trajectories)
    metrics = {"rollout/dynamic_dropped_groups": float(len(flat)), "rollout/dynamic_refill_groups": 0.0,
               "rollout/dynamic_refill_kept": 0.0}
    if not flat or max_groups <= 0:
        return trajectories, metrics, None
    kept = [t for t in trajectories if t.group_id not in flat]
    extra = await play(min(len(flat), max_groups))
    new_flat = zero_variance_groups(extra.trajectories)
    added = [t for t in extra.trajectories if t.group_id not in new_flat]
    metrics["rollout/dynamic_refill_groups"] = float(len({t.group_id for t in extra.trajectories}))
    metrics["rollout/dynamic_refill_kept"] = float(len({t.group_id for t in added}))
    batch = kept + added
    return (batch if batch else trajectories), metrics, extra
