"""Held-out evaluation: success rate, mean reward and pass@k, with per-task transcripts; with
task-scoped tool exposure also the same figures with every allowed tool shown (`eval/all_tools/`),
as a deployed model sees the tools. A further evaluation set (`data.evaluation_sets`) gets the
same figures under `eval/set=<name>/` (`set_metrics`)."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from grpo.collect.episode import task_id_of
from tools.secrets import mask_value


def _gold_steps(task: Any) -> list:
    return getattr(getattr(getattr(task, "reward_spec", None), "ground_truth", None), "tool_sequence", None) or []


def group_of(task: Any) -> dict[str, str]:
    """The groups a held-out task is reported in: its complexity; the number of calls of its gold
    chain (`calls=2`) and the servers the chain uses (`server=git`, several joined by `+`) when it
    has one; and its `extra_info.split` when it has one (generated tasks: `eval` = a trained
    template, `novel` = a template never trained on), then also calls and servers within the split
    (`eval/server=git`), so held-out templates are never mixed into the trained ones' figures; and
    its `extra_info.kind` when it has one (the calculator's `sum`, `word`, ...)."""
    groups = {}
    complexity = getattr(task, "complexity", None)
    if complexity:
        groups["complexity"] = str(complexity)
    steps = _gold_steps(task)
    by_chain = {}
    if steps:
        by_chain["calls"] = str(len(steps))
        servers = sorted({step.server for step in steps if step.server})
        if servers:
            by_chain["server"] = "+".join(servers)
    groups.update(by_chain)
    extra = getattr(task, "extra_info", None) or {}
    if extra.get("kind"):
        groups["kind"] = str(extra["kind"])
    split = extra.get("split")
    if split:
        groups["split"] = str(split)
        groups.update({f"{split}/{name}": value for name, value in by_chain.items()})
    return groups


def gold_tools(task: Any) -> list[str]:
    """The tools a task's gold chain calls, as the tool metrics name them (`server.tool`, or the
    tool alone where a step names no server), sorted; empty without a gold chain."""
    steps = _gold_steps(task)
    return sorted({f"{step.server}.{step.tool}" if step.server else step.tool for step in steps})


def grouped_success(trajectories: Sequence, tasks: Sequence, task_ids: Sequence[str], k: int,
                    prefix: str = "eval") -> dict[str, float]:
    """`<prefix>/success/<group>=<value>` per group of `group_of` (and its task count,
    `<prefix>/tasks/...`): a task whose episodes were all excluded counts as failed."""
    by_task: dict[str, list] = defaultdict(list)
    for traj in trajectories:
        by_task[traj.task_id].append(traj)
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for task, task_id in zip(tasks, task_ids):
        wins = sum(t.success for t in by_task.get(task_id, []))
        for name, value in group_of(task).items():
            totals[f"{name}={value}"][0] += wins
            totals[f"{name}={value}"][1] += k
    out = {}
    for key, (wins, attempts) in sorted(totals.items()):
        out[f"{prefix}/success/{key}"] = wins / attempts
        out[f"{prefix}/tasks/{key}"] = attempts / k
    return out


def set_metrics(metrics: dict[str, float], name: str) -> dict[str, float]:
    """An evaluation set's figures beside the held-out split's: `eval/success_rate` ->
    `eval/set=<name>/success_rate` (no key `evaluate` writes has a segment with `=` there)."""
    return {f"eval/set={name}/{key.removeprefix('eval/')}": value for key, value in metrics.items()}


def summary_figures(metrics: dict[str, float], tag: str, sets: Iterable[str] = ()) -> dict[str, float]:
    """summary.json's view of an evaluation: success and reward, and success per held-out group
    (complexity, split) as `success_<tag>/<group>`; the same of each further evaluation set with
    `/set=<name>` after the tag (`success_after/set=handwritten`)."""
    out = _set_summary(metrics, "eval", tag, "")
    for name in sets:
        out.update(_set_summary(metrics, f"eval/set={name}", tag, f"/set={name}"))
    return out


def _set_summary(metrics: dict[str, float], prefix: str, tag: str, where: str) -> dict[str, float]:
    out = {f"success_{tag}{where}": metrics[f"{prefix}/success_rate"],
           f"reward_{tag}{where}": metrics[f"{prefix}/reward_mean"]}
    groups = f"{prefix}/success/"
    out.update({f"success_{tag}{where}/{k.removeprefix(groups)}": v for k, v in metrics.items() if k.startswith(groups)})
    if f"{prefix}/all_tools/success_rate" in metrics:  # task-scoped tools: also every tool shown
        out[f"success_{tag}_all_tools{where}"] = metrics[f"{prefix}/all_tools/success_rate"]
    return out


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


ALL_TOOLS_METRICS = ("success_rate", "reward_mean", "excluded_tasks")
"""What `eval/all_tools/` reports (plus pass@k)."""


async def _with_every_tool(collector, tasks: Sequence, k: int, temperature: float, seed: int) -> dict[str, float]:
    """`eval/all_tools/...`: the tasks played with every allowed tool in the prompt."""
    scoped = collector.env_config
    every_tool = scoped.model_copy(update={"tools": scoped.tools.model_copy(update={"exposure": "all"})})
    with collector.playing_with(every_tool):
        result = await collector.collect(list(tasks), group_size=k, temperature=temperature, seed=seed, step=-1)
    metrics = summarize(result.trajectories, len(tasks), k, result.excluded_groups)
    kept = (*ALL_TOOLS_METRICS, f"pass@{k}")
    return {f"eval/all_tools/{name}": metrics[f"eval/{name}"] for name in kept}


def transcript_records(trajectories: Sequence, groups: dict[str, dict[str, str]] | None = None,
                       tools: dict[str, list[str]] | None = None) -> list[dict[str, Any]]:
    """One record per episode for the transcripts file, secrets masked (tools/secrets.py): the
    transcript holds what the model wrote and what tools returned; `prompt_messages` of it are
    the prompt (system prompt, worked examples, the request); `groups` by task id (`group_of`);
    `gold_tools` by task id (`gold_tools`)."""
    groups, tools = groups or {}, tools or {}
    return [
        mask_value({
            "task_id": t.task_id,
            "groups": groups.get(t.task_id, {}),
            "gold_tools": tools.get(t.task_id, []),
            "prompt_messages": t.metadata.get("prompt_messages"),
            "reward": t.reward,
            "success": t.success,
            "num_turns": t.num_turns,
            "num_tool_calls": t.num_tool_calls,
            "finish_reasons": t.finish_reasons,
            "reward_breakdown": t.metadata.get("reward_breakdown"),
            "transcript": t.metadata.get("transcript"),
        })[0]
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
    """Play each task k times at `temperature` (0 = greedy) and score it; with task-scoped tool
    exposure (and `environment.tools.eval_all_tools`) once more with every tool shown."""
    if not tasks:
        raise ValueError("evaluation needs at least one task")
    result = await collector.collect(list(tasks), group_size=k, temperature=temperature, seed=seed, step=-1)
    metrics = summarize(result.trajectories, len(tasks), k, result.excluded_groups)
    task_ids = [task_id_of(task, i) for i, task in enumerate(tasks)]
    metrics.update(grouped_success(result.trajectories, tasks, task_ids, k))
    exposure = collector.env_config.tools
    if exposure.exposure == "task" and exposure.eval_all_tools:
        metrics.update(await _with_every_tool(collector, tasks, k, temperature, seed))
    if transcripts_path is not None:
        transcripts_path.parent.mkdir(parents=True, exist_ok=True)
        groups = {task_id: group_of(task) for task_id, task in zip(task_ids, tasks, strict=True)}
        tools = {task_id: gold_tools(task) for task_id, task in zip(task_ids, tasks, strict=True)}
        records = transcript_records(result.trajectories, groups, tools)
        lines = [json.dumps(record, default=str) + "\n" for record in records]
        transcripts_path.write_text("".join(lines))  # one small write after the collection
    return metrics
