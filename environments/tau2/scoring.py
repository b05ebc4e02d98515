"""Scoring τ² episodes with τ²'s own evaluator, and pass^k over them as τ² reports it.

`evaluate_episode` wraps the episode into τ²'s `SimulationRun` and calls
`tau2.evaluator.evaluator.evaluate_simulation` (evaluation type `all`): a conversation that did
not end with a stop signal scores 0; otherwise the evaluator replays the episode's tool calls on a
fresh environment and compares its database with the one the reference actions produce (`DB`),
runs the environment assertions (`ENV_ASSERTION`), looks for every reference action among the
calls (`ACTION`) and for every piece of information in the agent's messages (`COMMUNICATE`); the
reward is the product over the task's `reward_basis`.

Natural-language assertions need an LLM judge: with `environment.tau2.judge.base_url` set they are
judged by τ²'s own judge prompt (evaluation type `all_with_nl_assertions`); without one they are
reported as skipped, and a task whose reward basis includes them scores 0 (never a silent pass).

Every component is reported in the episode's info whether or not it is in the reward basis
(`info["tau2"]["components"]`: 1.0 / 0.0, or None when the task has nothing to check there).
"""

from __future__ import annotations

import logging
import math
import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from environments.endpoint import OpenAIEndpoint
from environments.tau2 import official
from environments.tau2.config import Tau2JudgeConfig

log = logging.getLogger(__name__)


@dataclass
class EpisodeScore:
    reward: float
    success: bool
    details: dict[str, Any]

    def breakdown(self) -> dict[str, float]:
        """The numeric components (for the generic `reward_breakdown`)."""
        return {k: v for k, v in self.details.get("components", {}).items() if isinstance(v, float)}


def _all(flags: list[bool]) -> float | None:
    return None if not flags else float(all(flags))


def components(info: Any, nl_status: str) -> dict[str, Any]:
    """τ²'s per-check results of a RewardInfo, one value per component."""
    return {
        "db": None if info.db_check is None else float(info.db_check.db_reward),
        "env_assertions": _all([check.met for check in info.env_assertions or []]),
        "actions": _all([check.action_match for check in info.action_checks or []]),
        "communicate": _all([check.met for check in info.communicate_checks or []]),
        "nl_assertions": nl_status if nl_status != "judged" else _all([c.met for c in info.nl_assertions or []]),
    }


def _checks(info: Any) -> dict[str, list]:
    return {
        "action_checks": [{"action": c.action.name, "requestor": c.action.requestor, "match": c.action_match}
                          for c in info.action_checks or []],
        "communicate_checks": [{"info": c.info, "met": c.met} for c in info.communicate_checks or []],
        "env_assertion_checks": [{"function": c.env_assertion.func_name, "met": c.met} for c in info.env_assertions or []],
        "nl_assertion_checks": [{"assertion": c.nl_assertion, "met": c.met} for c in info.nl_assertions or []],
    }


def _without_nl_basis(task: Any) -> Any:
    scored = task.model_copy(deep=True)
    basis = scored.evaluation_criteria.reward_basis
    scored.evaluation_criteria.reward_basis = [b for b in basis if b.value != "NL_ASSERTION"]
    return scored


def evaluate_episode(domain: str, task: Any, messages: list[Any], termination: Any,
                     judge: Tau2JudgeConfig) -> EpisodeScore:
    """τ²'s verdict on one conversation (τ² `Message`s, in order) that ended for `termination`."""
    tau2 = official.load()
    run = tau2.simulation.SimulationRun(id=str(uuid.uuid4()), task_id=task.id, start_time="", end_time="",
                                        duration=0.0, termination_reason=termination, messages=messages)
    kinds = tau2.evaluator.EvaluationType
    criteria = task.evaluation_criteria
    basis = [b.value for b in criteria.reward_basis] if criteria is not None else []
    has_nl = bool(criteria is not None and criteria.nl_assertions)
    endpoint = (OpenAIEndpoint(judge.base_url, judge.model, judge.api_key_env, judge.timeout)
                if judge.base_url and has_nl else None)  # a missing key raises here, loudly
    nl_status = "judged" if endpoint is not None else "skipped" if has_nl else "none"
    details: dict[str, Any] = {"termination_reason": termination.value, "reward_basis": basis, "nl_assertions": nl_status}
    try:
        if endpoint is not None:
            with official.bound_llm(endpoint):
                info = tau2.evaluator.evaluate_simulation(run, task, kinds.ALL_WITH_NL_ASSERTIONS, False, domain)
        else:
            scored = _without_nl_basis(task) if "NL_ASSERTION" in basis else task
            info = tau2.evaluator.evaluate_simulation(run, scored, kinds.ALL, False, domain)
    # τ²'s replay raises when a recorded result does not reproduce (e.g. a tool that draws a uuid).
    except Exception as exc:  # noqa: BLE001
        log.warning("τ² %s task %s: evaluation failed: %r", domain, task.id, exc)
        return EpisodeScore(0.0, False, {**details, "reward": 0.0, "evaluation_error": repr(exc)[:1000]})
    reward = float(info.reward)
    if "NL_ASSERTION" in basis and nl_status == "skipped":
        reward = 0.0  # an assertion in the reward basis that nobody checked is not a pass
    details.update(reward=reward, components=components(info, nl_status), note=info.info,
                   reward_breakdown={getattr(k, "value", k): v for k, v in (info.reward_breakdown or {}).items()},
                   **_checks(info))
    return EpisodeScore(reward, bool(tau2.metrics.is_successful(reward)), details)


def tau2_reward(task: Any, episode: Any) -> float:
    """The `reward_spec.method` of τ² task records: their episodes are scored by the `tau2`
    environment; any other environment reaching this is misconfigured."""
    raise ValueError(f"task {getattr(task, 'task_id', '?')} is a τ² task: play it with env_class 'tau2' "
                     "(environment.env_class: tau2), which scores it with τ²'s evaluator")


def summarize(trajectories: Sequence, tasks: Sequence, k: int) -> dict[str, float]:
    """Per domain and overall, as τ² reports a run of k trials per task: pass^1..pass^k (τ²'s
    `pass_hat_k` averaged over tasks) and the average reward. A missing trial (an excluded
    episode group) counts as a failure with reward 0."""
    pass_hat_k = official.load().metrics.pass_hat_k
    is_successful = official.load().metrics.is_successful
    domain_of = {t.task_id: t.extra_info["tau2"]["domain"] for t in tasks}
    rewards: dict[str, list[float]] = defaultdict(list)
    for traj in trajectories:
        info = (traj.metadata.get("info") or {}).get("tau2") or {}
        rewards[traj.task_id].append(float(info.get("reward", traj.reward)))
    groups: dict[str, list[str]] = defaultdict(list)
    for task_id, domain in domain_of.items():
        groups[domain].append(task_id)
        groups["overall"].append(task_id)
    metrics: dict[str, float] = {}
    for group, task_ids in groups.items():
        successes = [sum(map(is_successful, rewards[t][:k])) for t in task_ids]
        for j in range(1, k + 1):
            metrics[f"tau2/{group}/pass^{j}"] = sum(pass_hat_k(k, s, j) for s in successes) / len(task_ids)
        metrics[f"tau2/{group}/avg_reward"] = math.fsum(sum(rewards[t][:k]) for t in task_ids) / (k * len(task_ids))
        metrics[f"tau2/{group}/tasks"] = float(len(task_ids))
    return metrics
