"""Gold trajectories: what a task's `tool_sequence` says to write, turn by turn, in one episode.

A gold turn is the step's call in the configured call format, and after the last step the answer.
Generated tasks often take a later argument from an earlier result (`ToolStep.picks`: the hash of
a commit the log shows, the current time a clock read) or their answer from the episode's own
call (`success.answer_from`: the current time): those values differ from episode to episode, so
the recorded ones would be stale. `gold_turn` therefore writes each turn from the results the
episode's own calls have returned so far (environments/tasks/picks.py), and `GoldPlayer` gives a
`ScriptedEngine` those calls: it keeps every episode's environment by its id, which is the
`session` of the episode's generation requests.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from environments.base import Environment, resolve
from environments.end_state import answer_from_calls
from environments.tasks.picks import PickError, picked_arguments
from environments.toolcalls import format_tool_call
from environments.turn_credit import step_result
from grpo.collect.collector import TrajectoryCollector
from grpo.rollout.base import GenerationRequest
from grpo.rollout.scripted import ScriptedEngine

CHECKS_ONLY_ANSWER = "Done."
"""The final turn of a task scored on its end state alone (it has no answer to give)."""


def gold_answer(task: Any, calls: Sequence[Any] = ()) -> Any:
    """The answer a gold episode gives: the recorded one, or (`answer_from`) what the episode's
    own call returned; ValueError when that call is not there."""
    success = task.reward_spec.ground_truth.success
    if success.answer_from is not None:
        value = answer_from_calls(task, calls)
        if value is None:
            raise ValueError(f"task {task.task_id!r}: its answer comes from step {success.answer_from.step}'s "
                             f"result (field {success.answer_from.field!r}), which this episode's calls do not give")
        return value
    if success.answer is None:
        return CHECKS_ONLY_ANSWER
    return success.answer[0] if isinstance(success.answer, list) else success.answer


def gold_turn(task: Any, turn: int, calls: Sequence[Any] = (), call_format: str = "auto") -> str:
    """Gold assistant turn `turn` (0-based) of `task` in an episode that has made `calls`: step
    `turn`'s call with its picked arguments taken from the episode's own results, then the answer
    (PickError when a result lacks a picked value, IndexError after the answer)."""
    steps = task.reward_spec.ground_truth.tool_sequence
    if turn < len(steps):
        step = steps[turn]
        params = (picked_arguments(step.params, step.picks, lambda ref: step_result(steps, calls, ref))
                  if step.picks else step.params)
        return format_tool_call(step.tool, params, call_format)
    if turn == len(steps):
        return f"<answer>{gold_answer(task, calls)}</answer>"
    raise IndexError(f"task {task.task_id!r}: the gold script has {len(steps) + 1} turns, turn {turn + 1} was asked for")


def gold_script(task: Any, call_format: str = "auto") -> list[str]:
    """Every gold turn as recorded (the arguments and answer the task holds), for tasks whose gold
    does not depend on the episode (no `picks`, no `answer_from`)."""
    return [gold_turn(task, k, (), call_format) for k in range(len(task.reward_spec.ground_truth.tool_sequence) + 1)]


class GoldPlayer:
    """The script of a `ScriptedEngine` that writes each gold turn from its episode's own calls.
    Its `env_factory` makes the episodes' environments (as the collector would) and keeps them."""

    def __init__(self, call_format: str = "auto"):
        self.call_format = call_format
        self.envs: dict[str, Environment] = {}
        self.failures: dict[str, str] = {}
        """Episodes (by id) whose gold turn could not be written, and why: each ends with an empty
        answer at once, and its trajectory must not be trained on."""

    def env_factory(self, tools, collector) -> Callable[[Any, str], Environment]:
        """An env factory for `collector` (its environment config, fitted to the tokenizer)."""
        def make(task: Any, episode_id: str) -> Environment:
            config = collector.env_config
            env = resolve(config.env_class or task.env_class)(tools, config, episode_id)
            self.envs[episode_id] = env
            return env
        return make

    def forget(self) -> None:
        """Drop the finished episodes' environments and failures (after each collection)."""
        self.envs.clear()
        self.failures.clear()

    def __call__(self, request: GenerationRequest) -> str:
        env = self.envs.get(request.session)
        if env is None or getattr(env, "task", None) is None:
            raise KeyError(f"no episode {request.session!r} for task {request.task_id!r}: "
                           "the collector must use this player's env_factory")
        # An environment that keeps no call records (not an MCP tool episode) plays the recorded gold.
        calls = getattr(getattr(env, "episode", None), "calls", None) or []
        try:
            return gold_turn(env.task, request.turn, calls, self.call_format)
        except (PickError, ValueError) as exc:
            # One episode's problem: an engine error would fail every episode of the batch.
            self.failures[request.session] = f"task {request.task_id!r} turn {request.turn + 1}: {exc}"
            return "<answer></answer>"


@dataclass
class GoldVerdict:
    """One task's gold chain replayed on fresh state and scored with the task's own reward."""

    task_id: str
    success: bool
    reason: str = ""
    """Why it failed: the turn that could not be written, or the criteria that did not hold."""


async def replay_gold(tasks: Sequence[Any], tools: Any, tokenizer: Any, env_config: Any,
                      rollout_config: Any) -> list[GoldVerdict]:
    """Play every task's gold chain (each turn written from the episode's own results) through the
    collector on the configured servers, one fresh episode per task, and score it with the task's
    own reward: the check that a task file still holds (`mcp-grpo evaluate --gold`)."""
    player = GoldPlayer()
    collector = TrajectoryCollector(ScriptedEngine(tokenizer, player), tokenizer, tools, env_config, rollout_config)
    collector.env_factory = player.env_factory(tools, collector)
    result = await collector.collect(list(tasks), 1, temperature=0.0, step=-1)
    played = {t.task_id: t for t in result.trajectories}
    failures = {env.task.task_id: why for episode, why in player.failures.items()
                if (env := player.envs.get(episode)) is not None}
    verdicts = []
    for task in tasks:
        trajectory = played.get(task.task_id)
        if trajectory is None:
            own = [e for e in result.errors if e.startswith((f"task {task.task_id}:", f"task {task.task_id} "))]
            verdicts.append(GoldVerdict(task.task_id, False, "the episode failed: " + ("; ".join(own)[:400] or
                                                                                     "no reason was recorded")))
        elif task.task_id in failures:
            verdicts.append(GoldVerdict(task.task_id, False, failures[task.task_id]))
        else:
            held = (trajectory.metadata.get("info") or {}).get("checks") or {}
            missed = sorted(name for name, ok in held.items() if not ok)
            reason = "" if trajectory.success else f"did not hold: {', '.join(missed) or 'the reward'}"
            verdicts.append(GoldVerdict(task.task_id, trajectory.success, reason))
    return verdicts
