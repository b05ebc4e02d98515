"""The order in which training tasks are served: seeded shuffling per epoch, resumable."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any


class TaskStream:
    """Serves `batch_size` tasks per call, reshuffling (seeded) at each epoch boundary.

    `state_dict()` captures the position, so a resumed run sees exactly the tasks an
    uninterrupted run would have seen.
    """

    def __init__(self, tasks: Sequence[Any], batch_size: int, seed: int = 0, shuffle: bool = True):
        if not tasks:
            raise ValueError("the training dataset is empty")
        self.tasks = list(tasks)
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.position = 0
        self._order = self._order_for(0)

    def _order_for(self, epoch: int) -> list[int]:
        order = list(range(len(self.tasks)))
        if self.shuffle:
            random.Random(self.seed * 100_003 + epoch).shuffle(order)
        return order

    def next_batch(self, size: int | None = None) -> list[Any]:
        """The next `size` tasks (default `batch_size`)."""
        size = self.batch_size if size is None else size
        batch = []
        while len(batch) < size:
            if self.position >= len(self._order):
                self.epoch += 1
                self.position = 0
                self._order = self._order_for(self.epoch)
            batch.append(self.tasks[self._order[self.position]])
            self.position += 1
        return batch

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position, "num_tasks": len(self.tasks)}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state["num_tasks"] != len(self.tasks):
            raise ValueError(
                f"checkpoint was taken with {state['num_tasks']} training tasks, the dataset now has "
                f"{len(self.tasks)}: resuming would serve different tasks"
            )
        self.epoch = state["epoch"]
        self.position = state["position"]
        self._order = self._order_for(self.epoch)
