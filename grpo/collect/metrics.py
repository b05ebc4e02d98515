"""Metrics of one collection: `collection_metrics` turns the kept trajectories, the batcher's
counters and the timeline (grpo/collect/timeline.py) into the flat `rollout/...` metrics of a
`CollectResult`."""

from __future__ import annotations

import math

from grpo.collect.generation_batcher import GenerationBatcher
from grpo.collect.timeline import Timeline
from grpo.trajectory import Trajectory


def collection_metrics(
    trajectories: list[Trajectory],
    batcher: GenerationBatcher,
    timeline: Timeline,
    wall: float,
    failed_episodes: int,
    excluded_groups: int,
) -> dict[str, float]:
    """Flat `rollout/` metrics. Rates and means are over the kept trajectories, except
    `gen_tokens` (every token the engine produced, failed episodes included).

    - episodes_per_s: kept episodes / wall seconds of the collection.
    - gen_tokens_per_s: generated tokens / wall seconds; engine_tokens_per_s: / generating s.
    - time_generating_s: wall time with an engine call in flight (calls run one at a time),
      less the time a serving engine waited on its feed (engine_idle_seconds).
    - time_in_tools_s: wall time with at least one episode inside its environment (reset, step,
      close: where tool calls happen) and no engine call in flight: the engine idles on tools.
    - time_tools_overlapped_s: environment time hidden under generation.
    - tool_wait_share / generating_share: those two times over the wall time.
    - engine_batches / mean_batch_size: engine calls and requests per call; joined_requests:
      requests that joined a running engine call (continuous batching; counted in its size).
    - engine_*: the engine's own counters summed over the calls, where it keeps them (HF):
      prefill_tokens, shared_prefix_tokens (prefill saved by prompts' common prefixes run
      once), kept_prefix_tokens (prefill saved by a batch's kept prefix, written into rows
      that join with it), resumed_requests (later turns that prefilled only their new tokens),
      decode_steps, prefix_attention_steps (decode steps that attended the kept prefix once for
      all the rows holding it), idle_seconds (a serving engine waiting for parked sessions' next turns,
      counted as tool time when episodes are in their environments, not as generating),
      joins (admissions into a running batch: one prefill each), prefill_seconds,
      graph_captures (CUDA graphs captured), steps_with_draws (decode steps that drew the next
      tokens inside the step).
    - parse_failure_rate: turns whose tool-call markup could not be read / turns;
      tool_error_rate: tool calls that returned an error / tool calls.
    - turn_credit_* (`environment.turn_credit: verified`): unit_score, the mean credit unit
      score; replay_forks, replay_calls and replay_s, the verification's cost over the step.
    """
    n = len(trajectories)

    def mean(values: list[float]) -> float:
        return sum(values) / len(values) if values else 0.0

    rewards = [t.reward for t in trajectories]
    reward_mean = mean(rewards)
    turns = sum(t.num_turns for t in trajectories)
    calls = sum(t.num_tool_calls for t in trajectories)
    lengths = [len(t.token_ids) for t in trajectories]
    seconds = timeline.seconds
    return {
        "rollout/episodes": float(n),
        "rollout/wall_s": wall,
        "rollout/episodes_per_s": n / wall if wall > 0 else 0.0,
        "rollout/gen_tokens_per_s": batcher.generated_tokens / wall if wall > 0 else 0.0,
        "rollout/engine_tokens_per_s": (
            batcher.generated_tokens / seconds["generating"]
            if seconds["generating"] > 0
            else 0.0
        ),
        "rollout/gen_tokens": float(batcher.generated_tokens),
        "rollout/turns_per_episode": turns / n if n else 0.0,
        "rollout/tool_calls_per_episode": calls / n if n else 0.0,
        "rollout/parse_failure_rate": (
            sum(t.metadata.get("parse_failures", 0) for t in trajectories) / turns
            if turns
            else 0.0
        ),
        "rollout/tool_error_rate": (
            sum(t.metadata.get("tool_errors", 0) for t in trajectories) / calls
            if calls
            else 0.0
        ),
        "rollout/traj_len_mean": mean([float(x) for x in lengths]),
        "rollout/traj_len_max": float(max(lengths, default=0)),
        "rollout/reward_mean": reward_mean,
        "rollout/reward_std": math.sqrt(mean([(r - reward_mean) ** 2 for r in rewards])),
        "rollout/success_rate": mean([1.0 if t.success else 0.0 for t in trajectories]),
        "rollout/truncated_rate": mean(
            [1.0 if t.metadata.get("truncated_total_tokens") else 0.0 for t in trajectories]
        ),
        "rollout/time_generating_s": seconds["generating"],
        "rollout/time_in_tools_s": seconds["tools_only"],
        "rollout/time_tools_overlapped_s": seconds["tools_overlapped"],
        "rollout/tool_wait_share": seconds["tools_only"] / wall if wall > 0 else 0.0,
        "rollout/generating_share": seconds["generating"] / wall if wall > 0 else 0.0,
        "rollout/engine_batches": float(len(batcher.batch_sizes)),
        "rollout/mean_batch_size": mean([float(b) for b in batcher.batch_sizes]),
        "rollout/joined_requests": float(batcher.joined),
        **{f"rollout/engine_{key}": value for key, value in batcher.engine_totals.items()},
        "rollout/failed_episodes": float(failed_episodes),
        "rollout/excluded_groups": float(excluded_groups),
        **_turn_credit_metrics(trajectories),
    }


def _turn_credit_metrics(trajectories: list[Trajectory]) -> dict[str, float]:
    """With verified turn credit: the share of units that scored, and what the replays cost
    (summed over the episodes; they run concurrently, so `seconds` exceeds their wall time)."""
    credits = [c for t in trajectories if isinstance(c := t.metadata.get("info", {}).get("turn_credit"), dict)]
    if not credits:
        return {}
    units = [unit for c in credits for unit in c.get("units", [])]
    return {
        "rollout/turn_credit_unit_score": sum(float(u[1]) for u in units) / len(units) if units else 0.0,
        "rollout/turn_credit_replay_forks": float(sum(c.get("forks", 0) for c in credits)),
        "rollout/turn_credit_replay_calls": float(sum(c.get("calls", 0) for c in credits)),
        "rollout/turn_credit_replay_s": float(sum(c.get("seconds", 0.0) for c in credits)),
    }
