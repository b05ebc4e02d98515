"""BFCL multi-turn tasks: reading the `bfcl-eval` package's data, converting it, and the splits.

The Berkeley Function Calling Leaderboard (Apache-2.0) ships its data inside the PyPI wheel
`bfcl-eval`; this module reads it through the package (nothing is copied into this repository):

- `bfcl_eval/data/BFCL_v4_multi_turn_<category>.json` (JSON lines, 200 entries each): the
  scripted user turns, the backends' initial configuration, the involved classes and, for
  `miss_func`, the functions withheld until a later turn;
- `bfcl_eval/data/possible_answer/...`: the ground-truth calls of every turn;
- `bfcl_eval/data/multi_turn_func_doc/*.json`: the documented function schemas.

`load_bfcl_tasks(categories, split)` converts entries into our `Task` records (env_class `bfcl`,
everything the environment needs under `extra_info["bfcl"]`). A dataset path `bfcl:<categories>:<split>`
(e.g. `bfcl:base:eval`, `bfcl:all:train`) loads them from a config (`environments.tasks.loading`).

The split is declared in `configs/data/bfcl_split.json`: a scenario index (the number at the end
of the id, shared by the four category variants of one scenario) belongs to `eval` when
`index % 4 == 0` and to `train` otherwise, so training never sees any variant of an evaluation
scenario. `split="all"` gives all 200 tasks of a category (for models not trained on BFCL).

`bfcl-eval` is an optional dependency (`pip install --no-deps bfcl-eval mpmath`): its declared
dependencies are heavy and pinned, while the multi-turn backends and checker need only `mpmath`.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import json
from functools import cache
from pathlib import Path
from typing import Any

from environments.tasks.loading import save_tasks
from environments.tasks.schema import Task
from environments.toolcalls import format_tool_call
from tools.servers.bfcl_backends import (
    CATEGORIES,
    BFCLUnavailable,
    backend_classes,
    check_category,
    function_owner,
    load_entries,
    require_bfcl,
)

__all__ = ["CATEGORIES", "SPLITS", "BFCLUnavailable", "load_bfcl_tasks", "load_path", "require_bfcl"]

SPLITS: tuple[str, ...] = ("train", "eval", "all")

SPLIT_FILE = Path(__file__).resolve().parents[2] / "configs" / "data" / "bfcl_split.json"
"""The declared train/eval split of scenario indices."""

PATH_PREFIX = "bfcl:"
"""Dataset paths of the form `bfcl:<category[,category...]|all>:<train|eval|all>`."""


def check_split(split: str) -> str:
    if split not in SPLITS:
        raise ValueError(f"unknown BFCL split {split!r}; choose from: {', '.join(SPLITS)}")
    return split


def parse_call(call: str) -> tuple[str, dict[str, Any]]:
    """A ground-truth call string (`sort('a.pdf')`, `cd(folder='x')`) as (name, keyword arguments);
    positional arguments are named from the backend method's signature."""
    node = ast.parse(call.strip(), mode="eval").body
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise TypeError(f"not a plain function call: {call!r}")
    name = node.func.id
    kwargs = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords}
    if node.args:
        cls = backend_classes()[function_owner()[name]]
        params = [p for p in inspect.signature(getattr(cls, name)).parameters if p != "self"]
        for param, arg in zip(params, node.args):
            kwargs[param] = ast.literal_eval(arg)
    return name, kwargs


def gold_script(bfcl: dict, call_format: str = "hermes") -> list[str]:
    """Assistant messages that replay the ground truth: per turn, one message with all of the
    turn's calls (when it has any), then one without a call, which ends the turn."""
    messages = []
    for calls in bfcl["ground_truth"]:
        if calls:
            messages.append("\n".join(format_tool_call(*parse_call(c), call_format) for c in calls))
        messages.append("Done.")
    return messages


# -- tasks -------------------------------------------------------------------------------------

def scenario_index(entry_id: str) -> int:
    """The number at the end of an id (`multi_turn_miss_func_17` -> 17)."""
    return int(entry_id.rsplit("_", 1)[1])


def split_rule(index: int) -> str:
    """The declared split of a scenario index (what configs/data/bfcl_split.json holds)."""
    return "eval" if index % 4 == 0 else "train"


@cache
def declared_split() -> dict[str, frozenset[int]]:
    """{"train": indices, "eval": indices} from the split file; they must be disjoint."""
    if not SPLIT_FILE.is_file():
        raise FileNotFoundError(f"the BFCL split file {SPLIT_FILE} is missing")
    data = json.loads(SPLIT_FILE.read_text(encoding="utf-8"))
    train, held_out = frozenset(data["train"]), frozenset(data["eval"])
    if train & held_out:
        raise ValueError(f"{SPLIT_FILE}: train and eval share scenario indices {sorted(train & held_out)[:5]}")
    return {"train": train, "eval": held_out}


def _complexity(turns: int) -> str:
    return "easy" if turns <= 3 else "medium" if turns <= 5 else "hard"


def to_task(entry: dict, category: str) -> dict:
    """One BFCL entry (with its `ground_truth`) as a task record for the `bfcl` environment."""
    turns = entry["question"]
    first = [m for m in turns[0] if m.get("role") in ("system", "user")]
    if not first:
        raise ValueError(f"{entry['id']}: the first turn has no user message")
    missed = {str(k): list(v) for k, v in (entry.get("missed_function") or {}).items()}
    return {
        "data_source": f"bfcl_v4_multi_turn_{category}",
        "env_class": "bfcl",
        "prompt": [{"role": m["role"], "content": m["content"]} for m in first],
        "reward_spec": {
            "method": ["environments.bfcl.scoring:bfcl_reward"],
            "ground_truth": {"task_id": entry["id"], "complexity": _complexity(len(turns))},
        },
        "extra_info": {"bfcl": {
            "id": entry["id"],
            "category": category,
            "index": scenario_index(entry["id"]),
            "turns": turns,
            "initial_config": entry.get("initial_config") or {},
            "involved_classes": list(entry["involved_classes"]),
            "missed_function": missed,
            "ground_truth": entry["ground_truth"],
            "excluded_function": list(entry.get("excluded_function") or []),
        }},
    }


def expand_categories(categories: str | list[str] | tuple[str, ...]) -> list[str]:
    if isinstance(categories, str):
        categories = [c.strip() for c in categories.split(",") if c.strip()]
    if list(categories) == ["all"]:
        return list(CATEGORIES)
    return [check_category(c) for c in categories]


def load_bfcl_tasks(categories: str | list[str] = "base", split: str = "eval", limit: int | None = None) -> list:
    """Validated `Task`s of the categories (in category order, then by scenario index), restricted
    to the declared split; `limit` keeps the first N of each category."""
    check_split(split)
    keep = None if split == "all" else declared_split()[split]
    tasks = []
    for category in expand_categories(categories):
        chosen = [e for e in load_entries(category) if keep is None or scenario_index(e["id"]) in keep]
        chosen.sort(key=lambda e: scenario_index(e["id"]))
        for entry in chosen[:limit]:
            tasks.append(Task.from_record(to_task(entry, category), f"bfcl-eval {entry['id']}"))
    return tasks


def load_path(path: str) -> list:
    """Tasks of a dataset path `bfcl:<categories|all>:<split>` (e.g. `bfcl:base,miss_func:train`)."""
    parts = path[len(PATH_PREFIX):].split(":") if path.startswith(PATH_PREFIX) else []
    if len(parts) != 2:
        raise ValueError(f"dataset path {path!r}: expected bfcl:<categories|all>:<train|eval|all>, "
                         "e.g. bfcl:base:eval")
    return load_bfcl_tasks(parts[0], parts[1])


def main(argv: list[str] | None = None) -> int:
    """`python -m environments.bfcl.data --category base --split train --out tasks.jsonl`"""
    parser = argparse.ArgumentParser(description="Convert BFCL multi-turn entries into task records")
    parser.add_argument("--category", default="base", help=f"{', '.join(CATEGORIES)}, a comma list, or all")
    parser.add_argument("--split", default="eval", choices=SPLITS)
    parser.add_argument("--out", required=True, help="a .jsonl, .json or .parquet file")
    args = parser.parse_args(argv)
    tasks = load_bfcl_tasks(args.category, args.split)
    save_tasks(tasks, args.out)
    print(f"wrote {len(tasks)} tasks to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
