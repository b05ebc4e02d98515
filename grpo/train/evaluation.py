"""Held-out evaluation: success rate, mean reward and pass@k, with per-task transcripts."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def summarize(trajectories: Sequence, num_tasks: int, k: int, excluded_groups: int = 0) -> dict[str, float]:
    """Metrics over evaluated episodes. A task whose episodes were excluded counts as failed."""
    by_task: dict[str, list] = defaultdict(list)
    for traj in trajectories:
        by_task[traj.task_id].append(traj)
    attempted = num_tasks * k
    successes = sum(t.success for t in trajectories)
    return {
        "eval/success_rate": successes / attempted if attempted else 0.0,
        f"eval/pass@{k}": sum(any(t.success for t in group) for group in by_task.values()) / num_tasks
        if num_tasks
        else 0.0,
        "eval/reward_mean": sum(t.reward for t in trajectories) / attempted if attempted else 0.0,
        "eval/turns_mean": sum(t.num_turns for t in trajectories) / max(len(trajectories), 1),
        "eval/tool_calls_mean": sum(t.num_tool_calls for t in trajectories) / max(len(trajectories), 1),
        "eval/num_tasks": float(num_tasks),
        "eval/excluded_tasks": float(excluded_groups),
    }


def transcript_records(trajectories: Sequence) -> list[dict[str, Any]]:
    return [
        {
            "task_id": t.task_id,
            "reward": t.reward,
            "success": t.success,
            "num_turns": t.num_turns,
            "num_tool_calls": t.num_tool_calls,
            "finish_reasons": t.finish_reasons,
            "reward_breakdown": t.metadata.get("reward_breakdown"),
            "transcript": t.metadata.get("transcript"),
        }
        for t in trajectories
    ]


async def evaluate(
    collector,
    tasks: Sequence,
    *,
    k: int = 1,
    temperature: float = 0.0,
    seed: int = 0,
    transcripts_path: Path | None = None,
) -> dict[str, float]:
    """Play each task k times at `temperature` (0 = greedy) and score it."""
    if not tasks:
        raise ValueError("evaluation needs at least one task")
    result = await collector.collect(list(tasks), group_size=k, temperature=temperature, seed=seed, step=-1)
    metrics = summarize(result.trajectories, len(tasks), k, result.excluded_groups)
    if transcripts_path is not None:
        transcripts_path.parent.mkdir(parents=True, exist_ok=True)
        lines = [json.dumps(record, default=str) + "\n" for record in transcript_records(result.trajectories)]
        transcripts_path.write_text("".join(lines))  # one small write after the collection
    return metrics
