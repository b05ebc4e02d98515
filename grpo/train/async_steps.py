"""The steps of `train.async_rollouts`, as part of GRPOTrainer: a producer plays rounds of
groups while each update runs in a worker thread; weights reach the engine, and evaluations run,
between rounds (the queue and its rules: grpo/train/pipeline.py).

`AsyncRolloutSteps` is mixed into GRPOTrainer (grpo/train/trainer.py) and uses its policy, engine,
collector, stream, logger and update (`_update`); it adds the loop of asynchronous steps and the
queue's part of a checkpoint.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from grpo.models.devices import release_free_memory
from grpo.train.pipeline import ProducerFailed, RolloutPipeline, Taken
from grpo.train.stops import TrainingStopped

log = logging.getLogger("mcp_grpo")


class AsyncRolloutSteps:
    def _check_async_engine(self) -> None:
        """Async rollouts need an engine with its own copy of the weights."""
        cfg = self.config
        if cfg.train.async_rollouts.enabled and self.engine_name == "hf" and not cfg.rollout.hf.copy_weights:
            raise ValueError(
                "train.async_rollouts needs the engine to sample from its own copy of the weights "
                "(the update changes the policy's while episodes play): set rollout.hf.copy_weights=true "
                "or train.async_rollouts.enabled=false"
            )

    def _keep_pipeline_state(self, state: dict[str, Any] | None) -> None:
        """A checkpoint's queue, for the async steps to start from."""
        self._pipeline_state = state
        if state and not self.config.train.async_rollouts.enabled:
            log.warning("the checkpoint holds %d finished groups and %d tasks of a round in flight from "
                        "async rollouts; with train.async_rollouts off they are not played or trained",
                        len(state["queue"]), len(state["replay"]))

    async def _async_steps(self, tools, started: float) -> None:
        """The steps of `train.async_rollouts`: the producer plays rounds while each update runs
        in a worker thread; weights and evaluations go in between rounds (grpo/train/pipeline.py)."""
        cfg = self.config
        options = cfg.train.async_rollouts
        self.pipeline = RolloutPipeline(
            self.stream.next_batch, self._play_round,
            round_tasks=options.round_tasks or cfg.train.tasks_per_step,
            max_staleness=options.max_staleness,
            capacity=options.max_queue_groups or cfg.train.tasks_per_step,
            version=self.step,
        )
        if self._pipeline_state:
            state = self._pipeline_state
            self.pipeline.load_state_dict({**state, "replay": [self.train_tasks[i] for i in state["replay"]]})
            self.pipeline.version = self.step  # the engine samples the resumed weights
            log.info("async rollouts: resumed with %d finished groups queued and %d tasks to play again",
                     len(state["queue"]), len(state["replay"]))
        self.pipeline.start()
        try:
            while self.step < cfg.train.steps and not self._out_of_time(started):
                await self._after_step(await self._one_async_step(tools))
        finally:
            await self.pipeline.stop()

    async def _play_round(self, tasks: list, index: int) -> list:
        """The producer's round `index`: G episodes of each task; the curriculum sees them all."""
        cfg = self.config
        collected = await self.collector.collect(tasks, cfg.algorithm.group_size, seed=cfg.seed, step=index)
        if not collected.trajectories:
            raise TrainingStopped(
                f"round {index}: every episode group failed ({collected.excluded_groups} excluded); "
                "see the warnings above for the episode errors"
            )
        self._round_metrics.append({**collected.metrics, **self._record_played(collected.trajectories, tasks)})
        return collected.trajectories

    async def _one_async_step(self, tools) -> dict[str, float]:
        cfg = self.config
        pipeline = self.pipeline
        t0 = time.time()
        idle_before = (pipeline.trainer_idle_s, pipeline.producer_idle_s)
        try:
            taken = await pipeline.take(cfg.train.tasks_per_step, self.step,
                                        max_flat=cfg.train.dynamic_sampling.max_refill_groups)
        except ProducerFailed as exc:
            self._save()  # the finished groups still queued are kept for a resume
            raise TrainingStopped(f"step {self.step}: {exc}") from exc
        trajectories = [t for group in taken.groups for t in group.trajectories]
        t_wait = time.time() - t0
        release_free_memory()
        update = asyncio.ensure_future(asyncio.to_thread(self._async_update, trajectories))
        try:
            stats, updated = await asyncio.shield(update)
        except asyncio.CancelledError:
            await update  # half an update cannot be checkpointed: let it finish, then keep it
            self.step += 1
            pipeline.commit()
            raise
        self.step += 1
        pipeline.commit()
        async with pipeline.between_rounds():
            if updated:
                self.engine.sync_weights(self.policy)
            pipeline.version = self.step
        release_free_memory()
        wall = time.time() - t0
        return self._log_step({**self._rounds_summary(), **self._async_metrics(taken, idle_before, wall)},
                              stats, tools, {"time/rollout_s": t_wait, "time/step_s": wall})

    def _async_update(self, trajectories: list) -> tuple[dict[str, float], bool]:
        """The worker thread's part: the update and the EMA reference step (the engine's weights
        are pushed by the event loop, between rounds)."""
        stats, updated = self._update(trajectories)
        if updated and self.reference is not None:
            self.reference.maybe_update(self.step + 1)
        return stats, updated

    def _rounds_summary(self) -> dict[str, float]:
        """The `rollout/` metrics of the rounds finished since the last step (their mean), with
        counts summed."""
        rounds, self._round_metrics = self._round_metrics, []
        summed = ("rollout/failed_episodes", "rollout/excluded_groups", "rollout/wall_s")
        merged: dict[str, float] = {}
        for key in {k for r in rounds for k in r}:
            values = [r[key] for r in rounds if key in r]
            merged[key] = float(sum(values) if key in summed else sum(values) / len(values))
        return merged

    def _async_metrics(self, taken: Taken, idle_before: tuple[float, float], wall: float) -> dict[str, float]:
        pipeline = self.pipeline
        lags = taken.staleness or [0]
        return {
            "async/staleness_mean": sum(lags) / len(lags),
            "async/staleness_max": float(max(lags)),
            "async/queue_groups": float(len(pipeline.queue)),
            "async/dropped_stale_groups": float(taken.dropped_stale),
            "async/finished_groups": float(pipeline.finished_groups),
            "async/trainer_idle_share": (pipeline.trainer_idle_s - idle_before[0]) / max(wall, 1e-9),
            "async/producer_idle_share": (pipeline.producer_idle_s - idle_before[1]) / max(wall, 1e-9),
            "rollout/dynamic_dropped_groups": float(taken.dropped_flat),
        }

    def _pipeline_checkpoint(self) -> dict[str, Any] | None:
        """The async queue as a checkpoint keeps it: tasks as their index in the training set."""
        if self.pipeline is None:
            return None
        state = self.pipeline.state_dict()
        index = {id(task): i for i, task in enumerate(self.train_tasks)}
        return {**state, "replay": [index[id(task)] for task in state["replay"]]}
