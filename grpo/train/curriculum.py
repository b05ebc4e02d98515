"""A curriculum by learnability: tasks served from buckets weighted by p(1 - p).

Tasks fall into buckets by complexity and the tools their `tool_sequence` uses (`bucket_of`). Each
bucket keeps p, its recent success rate (an exponential moving average of the success of its
episodes in each step, `ema` the weight of the newest). A bucket is drawn with probability
proportional to max(p (1 - p), floor): buckets the policy sometimes solves carry the most signal
for GRPO, while solved (p = 1) and hopeless (p = 0) ones keep the floor. Before any episode the
buckets of the simplest complexity present start at p = 0.5 and the others at 0, so training
starts on one-call tasks and moves on as longer chains start to succeed; `start="all"` starts every
bucket at 0.5 instead (each is tried until its own success is known). Within a bucket tasks are
served in a seeded shuffled order, each once per pass. `state_dict` makes a resumed run serve
exactly what an uninterrupted one would.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

COMPLEXITY_ORDER = ("easy", "medium", "hard")


def bucket_of(task: Any) -> str:
    """`complexity|tool+tool`: the task's complexity and the sorted tools of its tool sequence."""
    gt = task.reward_spec.ground_truth
    tools = sorted({step.tool for step in gt.tool_sequence})
    return f"{gt.complexity}|{'+'.join(tools) or '-'}"


def learnability_weights(p: dict[str, float], floor: float) -> dict[str, float]:
    """Normalised max(p (1 - p), floor) per bucket."""
    raw = {b: max(v * (1.0 - v), floor) for b, v in p.items()}
    total = sum(raw.values())
    return {b: w / total for b, w in raw.items()}


class CurriculumStream:
    """Serves `batch_size` tasks per call from learnability-weighted buckets (see the module doc);
    `record(trajectories)` after each step updates the buckets' success rates."""

    def __init__(self, tasks: Sequence[Any], batch_size: int, seed: int = 0, *, floor: float = 0.05,
                 ema: float = 0.3, start: str = "simplest"):
        if not tasks:
            raise ValueError("the training dataset is empty")
        if not 0.0 < floor <= 0.25:
            raise ValueError(f"curriculum floor must lie in (0, 0.25], got {floor}")
        if not 0.0 < ema <= 1.0:
            raise ValueError(f"curriculum ema must lie in (0, 1], got {ema}")
        if start not in ("simplest", "all"):
            raise ValueError(f"curriculum start must be 'simplest' or 'all', got {start!r}")
        self.tasks = list(tasks)
        self.batch_size = batch_size
        self.floor, self.ema = floor, ema
        self.members: dict[str, list[int]] = defaultdict(list)
        for index, task in enumerate(self.tasks):
            self.members[bucket_of(task)].append(index)
        levels = [b.split("|")[0] for b in self.members]
        simplest = min(levels, key=lambda c: COMPLEXITY_ORDER.index(c) if c in COMPLEXITY_ORDER else 99)
        self.p = {b: (0.5 if start == "all" or b.split("|")[0] == simplest else 0.0) for b in sorted(self.members)}
        self._bucket_by_task = {id(task): bucket_of(task) for task in self.tasks}
        self.rng = random.Random(f"mcp-grpo|curriculum|{seed}")
        self.orders = {b: self._shuffled(b) for b in self.p}
        self.positions = {b: 0 for b in self.p}
        self.last_success: dict[str, float] = {}

    def _shuffled(self, bucket: str) -> list[int]:
        order = list(self.members[bucket])
        self.rng.shuffle(order)
        return order

    def weights(self) -> dict[str, float]:
        return learnability_weights(self.p, self.floor)

    def next_batch(self, size: int | None = None) -> list[Any]:
        """The next `size` tasks (default `batch_size`), each from a bucket drawn by weight."""
        weights = self.weights()
        buckets = list(weights)
        batch = []
        size = self.batch_size if size is None else size
        for bucket in self.rng.choices(buckets, weights=[weights[b] for b in buckets], k=size):
            if self.positions[bucket] >= len(self.orders[bucket]):
                self.orders[bucket], self.positions[bucket] = self._shuffled(bucket), 0
            batch.append(self.tasks[self.orders[bucket][self.positions[bucket]]])
            self.positions[bucket] += 1
        return batch

    def record(self, trajectories: Sequence[Any], tasks: Sequence[Any], task_ids: Sequence[str]) -> None:
        """Fold this step's episode successes into each bucket's p (`tasks` in `task_ids` order)."""
        bucket_of_id = {tid: self._bucket_by_task.get(id(t), bucket_of(t)) for t, tid in zip(tasks, task_ids)}
        wins: dict[str, list[bool]] = defaultdict(list)
        for traj in trajectories:
            bucket = bucket_of_id.get(traj.task_id)
            if bucket in self.p:
                wins[bucket].append(bool(traj.success))
        self.last_success = {b: sum(w) / len(w) for b, w in wins.items()}
        for bucket, rate in self.last_success.items():
            self.p[bucket] = (1.0 - self.ema) * self.p[bucket] + self.ema * rate

    def metrics(self) -> dict[str, float]:
        out = {f"curriculum/weight/{b}": w for b, w in self.weights().items()}
        out.update({f"curriculum/p/{b}": v for b, v in self.p.items()})
        out.update({f"curriculum/success/{b}": v for b, v in self.last_success.items()})
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"p": dict(self.p), "orders": {b: list(o) for b, o in self.orders.items()},
                "positions": dict(self.positions), "rng": self.rng.getstate(), "num_tasks": len(self.tasks)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["num_tasks"] != len(self.tasks) or set(state["p"]) != set(self.p):
            raise ValueError("the checkpoint's curriculum was built over other training tasks: resuming "
                             "would serve different tasks")
        self.p = dict(state["p"])
        self.orders = {b: list(o) for b, o in state["orders"].items()}
        self.positions = dict(state["positions"])
        self.rng.setstate(state["rng"])
