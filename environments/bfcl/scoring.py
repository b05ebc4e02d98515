"""Scoring BFCL multi-turn episodes with the official checker, and summarising them by category.

`official_check(bfcl, decoded)` runs `bfcl_eval`'s `multi_turn_checker` exactly as its eval runner
does: the model's calls per turn and per step (call strings such as `cd(folder='x')`) are executed
on fresh backend instances next to the ground truth, and after every turn the instances' states
and the execution results are compared. An episode whose number of turns differs from the ground
truth's (stopped early, or forced to quit at the step limit) fails as `multi_turn:force_terminated`,
as in the runner.

The checker keeps backend instances in its module's globals, keyed by a model name and the entry
id; every check here uses a fresh name and removes its instances afterwards, so checks of the same
task never share state and memory does not grow.

`summarize(trajectories, tasks)` gives per-category official accuracy and the per-turn credit
(reported under separate keys: `bfcl/<category>/accuracy` vs `bfcl/<category>/turn_credit`).
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from environments.bfcl.data import require_bfcl


@dataclass
class CheckResult:
    valid: bool
    error_type: str | None = None
    error_message: str | None = None


def _checker_modules() -> tuple[Any, Any]:
    require_bfcl()
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_checker, multi_turn_utils

    return multi_turn_checker, multi_turn_utils


def official_check(bfcl: dict, decoded: Sequence[Sequence[Sequence[str]]], turns: int | None = None) -> CheckResult:
    """The official verdict on the model's decoded calls of the first `turns` turns (all by default):
    `decoded[turn][step]` lists the call strings the model wrote in one step of that turn."""
    checker, utils = _checker_modules()
    ground_truth = bfcl["ground_truth"] if turns is None else bfcl["ground_truth"][:turns]
    decoded = [[list(step) for step in turn if step] for turn in decoded]  # the runner drops empty steps
    if len(decoded) != len(ground_truth):
        return CheckResult(False, "multi_turn:force_terminated",
                           f"the model's turns ({len(decoded)}) do not match the ground truth's ({len(ground_truth)})")
    category = bfcl["id"].rsplit("_", 1)[0]
    entry = {"id": bfcl["id"], "initial_config": bfcl["initial_config"], "involved_classes": bfcl["involved_classes"]}
    model_name = f"mcpgrpo{uuid.uuid4().hex}"
    try:
        result = checker.multi_turn_checker(decoded, ground_truth, entry, category, model_name)
    # The checker asserts on inconsistent instances; any failure inside it is a failed check.
    except Exception as exc:  # noqa: BLE001
        return CheckResult(False, "checker_error", f"{type(exc).__name__}: {exc}")
    finally:
        namespace = vars(utils)
        for key in [k for k in namespace if k.startswith(model_name)]:
            del namespace[key]
    if result.get("valid"):
        return CheckResult(True)
    return CheckResult(False, result.get("error_type"), str(result.get("error_message")))


def bfcl_reward(task: Any, episode: Any) -> float:
    """The `reward_spec.method` of BFCL task records. Their episodes are scored by the `bfcl`
    environment; any other environment reaching this is misconfigured."""
    raise ValueError(f"task {getattr(task, 'task_id', '?')} is a BFCL task: play it with env_class 'bfcl' "
                     "(environment.env_class: bfcl), which scores it with the official checker")


def summarize(trajectories: Sequence, tasks: Sequence) -> dict[str, float]:
    """Per category and overall: official accuracy (`accuracy`), mean per-turn credit
    (`turn_credit`) and task counts. A task without a trajectory (excluded) counts as failed."""
    category_of = {t.task_id: t.extra_info["bfcl"]["category"] for t in tasks}
    by_task: dict[str, list] = defaultdict(list)
    for traj in trajectories:
        by_task[traj.task_id].append(traj)
    official: dict[str, list[float]] = defaultdict(list)
    credit: dict[str, list[float]] = defaultdict(list)
    for task_id, category in category_of.items():
        for traj in by_task.get(task_id) or [None]:
            info = (traj.metadata.get("info") or {}).get("bfcl", {}) if traj is not None else {}
            for key in (category, "overall"):
                official[key].append(1.0 if info.get("official") else 0.0)
                credit[key].append(float(info.get("turn_credit", 0.0)))
    metrics: dict[str, float] = {}
    for key, verdicts in official.items():
        metrics[f"bfcl/{key}/accuracy"] = sum(verdicts) / len(verdicts)
        metrics[f"bfcl/{key}/turn_credit"] = sum(credit[key]) / len(credit[key])
        metrics[f"bfcl/{key}/episodes"] = float(len(verdicts))
    return metrics
