"""Asynchronous rollouts (`train.async_rollouts`): a producer plays groups while the trainer updates.

The producer plays rounds of tasks (`round_tasks` tasks x G episodes, one `collect` each) with
the weights the engine has, tags every finished group with that policy version and queues it.
The trainer takes `n` groups per step (`take`); a group whose version lags the trainer's by more
than `max_staleness` updates is dropped and counted, as are (up to `max_flat`) groups whose
episodes all got one reward, which carry no GRPO signal. Weights reach the engine only between
rounds (`between_rounds`: the trainer pushes there, and evaluates there), so every round is
sampled by one known version, and the engine's copy is never read while it is being written.

Nothing is lost across a checkpoint: `state_dict()` holds the finished groups not yet trained
(those the trainer has taken for an update still in progress first) and the tasks of the round
in flight; `load_state_dict` queues the groups again and the producer plays those tasks first,
so a resumed run trains every finished group once and repeats none (an in-flight round's
episodes are played again from the start, on fresh per-episode server state).

A failure on either side stops the other: the producer's exception reaches the trainer's next
`take` as ProducerFailed (the finished groups stay queued for the checkpoint); `stop()` cancels
the producer.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from grpo.algorithm.estimators import zero_variance_groups
from grpo.trajectory import Trajectory


class ProducerFailed(RuntimeError):
    """The producer of rollouts stopped on an exception; the message says which."""


@dataclass
class Group:
    """One task's G finished episodes, sampled by the weights of `version` updates."""

    trajectories: list[Trajectory]
    version: int
    round: int

    @property
    def flat(self) -> bool:
        """Every episode got the same reward: no GRPO signal."""
        return bool(zero_variance_groups(self.trajectories))


@dataclass
class Taken:
    """What one `take` handed the trainer and what it dropped on the way."""

    groups: list[Group]
    dropped_stale: int = 0
    dropped_flat: int = 0
    waited_s: float = 0.0
    staleness: list[int] = field(default_factory=list)


def split_groups(trajectories: list[Trajectory], version: int, round_index: int) -> list[Group]:
    """The whole groups of one collection (consecutive trajectories sharing a group id), each
    tagged with the version that sampled it."""
    groups: dict[str, list[Trajectory]] = {}
    for trajectory in trajectories:
        trajectory.policy_version = version
        groups.setdefault(trajectory.group_id, []).append(trajectory)
    return [Group(members, version, round_index) for members in groups.values()]


PlayRound = Callable[[list, int], Awaitable[list[Trajectory]]]
"""`play(tasks, round_index)`: play G episodes of each task; the whole groups' trajectories."""


class RolloutPipeline:
    """The queue between the producer (`run`) and the trainer (`take`, `commit`, `between_rounds`).

    `draw(n)` serves the next `n` training tasks; `play` is PlayRound. `version` is the weights'
    version the engine samples with; the trainer sets it inside `between_rounds` after a push.
    """

    def __init__(self, draw: Callable[[int], list], play: PlayRound, *, round_tasks: int,
                 max_staleness: int, capacity: int, version: int = 0) -> None:
        self.draw = draw
        self.play = play
        self.round_tasks = round_tasks
        self.max_staleness = max_staleness
        self.capacity = capacity
        self.version = version
        self.round = 0
        self.queue: deque[Group] = deque()
        self.taking: list[Group] = []
        """Groups handed to the update in progress (kept for a checkpoint until `commit`)."""
        self.in_flight: list = []
        """The tasks of the round being played."""
        self.replay: list = []
        """Tasks of an interrupted round, played before any new one is drawn."""
        self.failure: BaseException | None = None
        self.producer_idle_s = 0.0
        self.trainer_idle_s = 0.0
        self.finished_groups = 0
        self._rounds = asyncio.Lock()
        self._changed = asyncio.Condition()
        self._task: asyncio.Task | None = None

    # ---------------------------------------------------------------- producer
    def start(self) -> None:
        if self._task is None or self._task.done():
            self.failure = None
            self._task = asyncio.create_task(self._produce(), name="rollout-producer")

    async def stop(self) -> None:
        """Cancel the producer (its round in flight is kept in `in_flight` for a checkpoint)."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _produce(self) -> None:
        try:
            while True:
                await self._wait_for_room()
                async with self._rounds:
                    await self._one_round()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001  (any failure: the trainer's next take raises it)
            self.failure = exc
            async with self._changed:
                self._changed.notify_all()

    async def _wait_for_room(self) -> None:
        t0 = time.perf_counter()
        async with self._changed:
            await self._changed.wait_for(lambda: len(self.queue) < self.capacity)
        self.producer_idle_s += time.perf_counter() - t0

    async def _one_round(self) -> None:
        if not self.in_flight:
            if self.replay:
                self.in_flight, self.replay = self.replay[: self.round_tasks], self.replay[self.round_tasks:]
            else:
                self.in_flight = list(self.draw(self.round_tasks))
        version, index = self.version, self.round
        trajectories = await self.play(self.in_flight, index)
        groups = split_groups(trajectories, version, index)
        # No await from here on: the groups, the round counter and `in_flight` change together.
        self.round += 1
        self.in_flight = []
        self.queue.extend(groups)
        self.finished_groups += len(groups)
        async with self._changed:
            self._changed.notify_all()

    # ---------------------------------------------------------------- trainer
    async def take(self, n: int, version: int, max_flat: int = 0) -> Taken:
        """`n` groups at most `max_staleness` updates behind `version`, in the order they finished;
        up to `max_flat` zero-variance groups are dropped on the way (dynamic sampling). Waits for
        the producer; raises ProducerFailed when it has stopped on an error."""
        taken = Taken(groups=self.taking)
        t0 = time.perf_counter()
        while len(self.taking) < n:
            if not self.queue:
                async with self._changed:
                    # The groups taken or dropped so far made room: a producer waiting on a full
                    # queue must play on, or both sides would wait for each other.
                    self._changed.notify_all()
                    await self._changed.wait_for(lambda: bool(self.queue) or self.failure is not None)
                if not self.queue and self.failure is not None:
                    raise ProducerFailed(
                        f"the rollout producer stopped: {type(self.failure).__name__}: {self.failure}"
                    ) from self.failure
                continue
            group = self.queue.popleft()
            lag = version - group.version
            if lag > self.max_staleness:
                taken.dropped_stale += 1
            elif group.flat and taken.dropped_flat < max_flat:
                taken.dropped_flat += 1
            else:
                self.taking.append(group)
                taken.staleness.append(lag)
        async with self._changed:
            self._changed.notify_all()  # room for the producer
        taken.waited_s = time.perf_counter() - t0
        self.trainer_idle_s += taken.waited_s
        return taken

    def commit(self) -> None:
        """The update on the taken groups is done: they leave the checkpoint's queue."""
        self.taking = []

    @contextlib.asynccontextmanager
    async def between_rounds(self) -> AsyncIterator[None]:
        """No round is being played inside the block (it waits for the one in flight to finish):
        push weights, evaluate. Time spent waiting counts as the trainer's idle time."""
        t0 = time.perf_counter()
        async with self._rounds:
            self.trainer_idle_s += time.perf_counter() - t0
            yield

    # ---------------------------------------------------------------- checkpoint
    def state_dict(self) -> dict[str, Any]:
        return {
            "queue": [*self.taking, *self.queue],
            "replay": [*self.in_flight, *self.replay],
            "version": self.version,
            "round": self.round,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.queue = deque(state["queue"])
        self.taking = []
        self.replay = list(state["replay"])
        self.in_flight = []
        self.version = state["version"]
        self.round = state["round"]
