"""The GRPO trainer: wires policy, reference, engine, tools, data and collector into a run.

`GRPOTrainer(config).run()` does: check the tasks' tool names against the started servers →
evaluate before (the held-out tasks, then each of `data.evaluation_sets`) → for each step:
collect groups → update (grpo/algorithm/update.py) → EMA reference → push weights to the engine →
metrics → checkpoint → evaluate after → final model, summary.json and the reward/success curve.
Ctrl-C checkpoints the last finished step and raises TrainingInterrupted, which says where the run
stopped and how to resume it. With `train.async_rollouts` the steps instead take groups from a
producer that keeps playing while the update runs (grpo/train/async_steps.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from typing import Any

import torch

from environments.tasks.loading import evaluation_sets, train_validation_split
from environments.tasks.tool_references import check_tool_references
from grpo.algorithm.reference import make_reference
from grpo.algorithm.update import (
    NonFiniteLossError,
    UpdateSettings,
    make_grad_scaler,
    make_optimizer,
    make_scheduler,
    train_step,
)
from grpo.collect.collector import TrajectoryCollector
from grpo.collect.episode import task_id_of
from grpo.collect.prompt_budget import check_prompt_budget
from grpo.config import RunConfig, save_config
from grpo.models.devices import (
    memory_metrics,
    release_free_memory,
    resolve_device,
    select_attention_kernels,
)
from grpo.models.export import save_pretrained
from grpo.models.policy import PolicyWithValueHead
from grpo.report.page import write_report
from grpo.report.samples import append_sample, token_record
from grpo.rollout.registry import choose_engine, make_engine
from grpo.train.async_steps import AsyncRolloutSteps
from grpo.train.checkpoint import (
    latest_checkpoint,
    load_checkpoint,
    resolve_resume,
    restore_rng_state,
    save_checkpoint,
)
from grpo.train.curriculum import CurriculumStream
from grpo.train.evaluation import grouped_success, summary_figures
from grpo.train.logger import MetricsLogger, close_run_logging, setup_console_logging
from grpo.train.pipeline import RolloutPipeline
from grpo.train.plots import plot_curves
from grpo.train.refill import refill
from grpo.train.run_evaluations import RunEvaluations
from grpo.train.step_memory import check_step_memory, model_shape
from grpo.train.stops import TrainingInterrupted, TrainingStopped
from grpo.train.task_stream import TaskStream
from grpo.train.warmup import warm_start
from tools.manager import SharedToolManager

log = logging.getLogger("mcp_grpo")


class GRPOTrainer(AsyncRolloutSteps, RunEvaluations):
    def __init__(self, config: RunConfig):
        self.config = config
        self.run_dir = config.run_dir
        self.step = 0
        self.history: list[dict[str, float]] = []
        self._nonfinite_in_a_row = 0
        self._saved_step: int | None = None
        self.pipeline: RolloutPipeline | None = None
        """The producer-trainer queue of `train.async_rollouts` (None: synchronous steps)."""
        self._pipeline_state: dict[str, Any] | None = None  # the queue of a resumed checkpoint
        self._round_metrics: list[dict[str, float]] = []  # rounds finished since the last step

    # ---------------------------------------------------------------- setup
    @property
    def is_main_process(self) -> bool:
        """Rank 0 (or the only process) writes the run's files and speaks for it."""
        return int(os.environ.get("RANK", "0")) == 0

    def setup(self) -> None:
        cfg = self.config
        main = self.is_main_process
        # Other ranks of a data-parallel run report only warnings: rank 0 speaks for the run.
        setup_console_logging(self.run_dir if main else None, logging.INFO if main else logging.WARNING)
        torch.manual_seed(cfg.seed)
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        self.device, why = resolve_device(cfg.device)
        log.info("device: %s (%s)", self.device, why)
        select_attention_kernels(self.device, cfg.model)
        # Before anything is loaded: a step no memory here can hold stops now, naming the fields.
        engine_name, _ = choose_engine(cfg.rollout.engine, self.device)
        log.info("step memory: %s", check_step_memory(cfg, model_shape(cfg.model), self.device, engine_name))
        if main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            save_config(cfg, self.run_dir / "config.yaml")

        self.train_tasks, self.val_tasks = train_validation_split(cfg.data, cfg.environment.env_class)
        self.eval_sets = evaluation_sets(cfg.data, self.train_tasks, cfg.environment.env_class)
        log.info("data: %d training tasks, %d held-out tasks%s", len(self.train_tasks), len(self.val_tasks),
                 "".join(f", {len(tasks)} in the evaluation set {name}" for name, tasks in self.eval_sets.items()))
        curriculum = cfg.train.curriculum
        self.stream = (CurriculumStream(self.train_tasks, cfg.train.tasks_per_step, cfg.seed,
                                        floor=curriculum.floor, ema=curriculum.ema, start=curriculum.start)
                       if curriculum.enabled else
                       TaskStream(self.train_tasks, cfg.train.tasks_per_step, cfg.seed, cfg.data.shuffle))

        self.policy, self.tokenizer = PolicyWithValueHead.from_config(
            cfg.model, cfg.lora, device=self.device, seed=cfg.seed
        )
        log.info("policy: %s, %.1fM trainable parameters", cfg.model.name_or_path,
                 self.policy.num_trainable_parameters() / 1e6)
        # With the KL off nothing scores tokens under the reference: skip building it.
        self.reference = make_reference(self.policy, cfg.algorithm.reference) if cfg.algorithm.uses_reference else None
        self.settings = UpdateSettings.from_config(cfg, pad_token_id=self.tokenizer.pad_token_id)
        self.optimizer = make_optimizer(self.policy, cfg.algorithm.optimizer)
        self.scheduler = make_scheduler(self.optimizer, cfg.algorithm.optimizer)
        self.scaler = make_grad_scaler(self.policy)  # fp16 compute only: loss scaling
        self.engine_name, why = choose_engine(cfg.rollout.engine, self.device)
        log.info("rollout engine: %s (%s)", self.engine_name, why)
        self.engine = make_engine(self.engine_name, policy=self.policy, tokenizer=self.tokenizer,
                                  config=cfg, device=self.device)
        log.info("rollout engine: %s", ", ".join(f"{k}={v}" for k, v in self.engine.describe().items()))
        self._check_async_engine()
        self.logger = MetricsLogger(
            self.run_dir if main else None,
            is_main_process=main,
            log_every=cfg.logging.log_every,
            wandb_config=cfg.logging.wandb,
            run_name=cfg.run_name,
            config_dict=cfg.dump_masked(),
        )
        self._wrap_for_training()
        self._maybe_resume()

    # ------------------------------------------------ hooks (the distributed trainer overrides)
    def _wrap_for_training(self) -> None:
        """Wrap policy and optimizer for data parallelism; a single process has nothing to do."""

    def _local_share(self, tasks: list) -> list:
        """The tasks this process plays (data parallelism: its share of whole groups)."""
        return list(tasks)

    def _trajectories_to_train(self, collected) -> list:
        """The trajectories this process updates on (data parallelism: balanced across ranks)."""
        return collected.trajectories

    def _train_step(self, trajectories: list) -> dict[str, float]:
        sample: dict | None = {} if self.is_main_process and self.config.logging.token_samples else None
        stats = train_step(
            self.policy, self.reference, self.optimizer, self.scheduler,
            trajectories, self.settings, check_logprobs=(self.step == 0), scaler=self.scaler, sample=sample,
        )
        if sample:  # the report's token view (grpo/report/samples.py)
            append_sample(self.run_dir, token_record(self.step + 1, trajectories[sample["row"]], sample,
                                                     self.tokenizer))
        return stats

    def _after_update(self) -> None:
        """EMA reference step, then the engine samples from the updated weights."""
        if self.reference is not None:
            self.reference.maybe_update(self.step)
        self.engine.sync_weights(self.policy)

    def _reduce_metrics(self, metrics: dict[str, float], weight: float = 1.0) -> dict[str, float]:
        """Metrics of the whole run from this process's (data parallelism: across ranks)."""
        return metrics

    def _save_final_model(self) -> None:
        if self.is_main_process:
            save_pretrained(self.policy, self.run_dir / "final_model", tokenizer=self.tokenizer)

    def _maybe_resume(self) -> None:
        path = resolve_resume(self.config.train.resume, self.run_dir)
        if path is None:
            return
        state = load_checkpoint(path)
        if "policy" not in state:
            raise ValueError(
                f"{path} is a data-parallel checkpoint (written by launch/distributed.py); resume it "
                "with `accelerate launch launch/distributed.py ... train.resume=...`"
            )
        self.policy.load_state_dict(state["policy"])
        if self.reference is not None and state.get("reference") is not None:
            self.reference.load_state_dict(state["reference"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.scaler is not None and state.get("grad_scaler") is not None:
            self.scaler.load_state_dict(state["grad_scaler"])
        self.stream.load_state_dict(state["data"])
        self.history = state.get("history", [])
        self._keep_pipeline_state(state.get("pipeline"))
        restore_rng_state(state["rng"])
        self.step = state["step"]
        self.logger.truncate_after(self.step)  # rows a killed run wrote after this checkpoint
        self.engine.sync_weights(self.policy)
        log.info("resumed from %s at step %d", path, self.step)

    def checkpoint_state(self) -> dict[str, Any]:
        return {
            "policy": self.policy.state_dict(),
            "reference": self.reference.state_dict() if self.reference is not None else None,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "grad_scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "data": self.stream.state_dict(),
            "history": self.history,
            "pipeline": self._pipeline_checkpoint(),
        }

    # ---------------------------------------------------------------- the loop
    async def run_async(self) -> dict[str, Any]:
        cfg = self.config
        started = time.time()
        summary: dict[str, Any] = {"run_dir": str(self.run_dir), "device": str(self.device),
                                   "engine": self.engine_name}
        try:
            try:
                async with SharedToolManager(cfg.tools) as tools:
                    await self._loop(tools, summary, started)
            except asyncio.CancelledError:
                # Ctrl-C: asyncio.run cancels the run at an await (a rollout, an evaluation), never
                # inside an update, so the last finished step is whole: keep it.
                self._save_on_interrupt()
                self.logger.close()
                raise
            self._save()
            if cfg.train.save_final_model:
                self._save_final_model()
            summary.update(steps=self.step, wall_minutes=(time.time() - started) / 60)
            self._write_summary(summary)
            self.logger.close()
            self.engine.close()
            return summary
        finally:
            close_run_logging(self.run_dir)

    async def _loop(self, tools, summary: dict[str, Any], started: float) -> None:
        cfg = self.config
        every_task = [*self.train_tasks, *self.val_tasks, *(t for tasks in self.eval_sets.values() for t in tasks)]
        # A task that names a tool no server offers would score 0 in every episode: stop first.
        check_tool_references(every_task, tools.tool_specs(), cfg.tools, cfg.environment)
        self.collector = TrajectoryCollector(self.engine, self.tokenizer, tools, cfg.environment, cfg.rollout)
        budget = await check_prompt_budget(every_task, tools, self.collector.env_config, self.tokenizer, cfg.rollout)
        if budget is not None:
            log.info("prompt budget: %s", budget.summary())
        if cfg.train.eval_before and self.step == 0:
            before = await self._evaluate("before")
            summary.update(summary_figures(before, "before", self.eval_sets))
        if cfg.train.warmup.steps and self.step == 0:
            await self._warm_start(tools)
            if cfg.train.warmup.eval_after:  # what the warm start alone gives, so GRPO's own gain shows
                summary.update(summary_figures(await self._evaluate("warmup"), "warmup", self.eval_sets))
        minutes = cfg.train.max_minutes
        self.logger.schedule(cfg.train.steps, self.step, started + 60 * minutes if minutes else None)
        if cfg.train.async_rollouts.enabled:
            await self._async_steps(tools, started)
        else:
            while self.step < cfg.train.steps and not self._out_of_time(started):
                await self._after_step(await self._one_step(tools))
        if cfg.train.eval_after:
            after = await self._evaluate("after")
            summary.update(summary_figures(after, "after", self.eval_sets))

    async def _after_step(self, metrics: dict[str, float]) -> None:
        """A finished step's history row, then its evaluation and checkpoint when due (with
        async rollouts the evaluation waits for the round in flight: grpo/train/pipeline.py)."""
        train = self.config.train
        self.history.append({k: v for k, v in metrics.items() if isinstance(v, float)})
        if train.eval_every and self.step % train.eval_every == 0 and self.step < train.steps:
            async with self.pipeline.between_rounds() if self.pipeline else contextlib.nullcontext():
                await self._evaluate(f"step{self.step}")
        if train.save_every and self.step % train.save_every == 0:
            self._save()

    def _out_of_time(self, started: float) -> bool:
        minutes = self.config.train.max_minutes
        if minutes and time.time() - started > 60 * minutes:
            log.info("train.max_minutes=%g reached after %d steps: stopping", minutes, self.step)
            return True
        return False

    def run(self) -> dict[str, Any]:
        self.setup()
        try:
            return asyncio.run(self.run_async())
        except KeyboardInterrupt:
            raise TrainingInterrupted(self._interrupted_at()) from None

    def _save_on_interrupt(self) -> None:
        """Checkpoint the last finished step (nothing when no step finished in this run)."""
        if self.step > 0:
            self._save()

    def _interrupted_at(self) -> str:
        where = f"at step {self.step} of {self.config.train.steps}"
        checkpoint = latest_checkpoint(self.run_dir)
        if checkpoint is None:
            return f"{where}: no checkpoint written"
        return f"{where}: checkpoint {checkpoint}; resume with train.resume=auto"

    async def _one_step(self, tools) -> dict[str, float]:
        cfg = self.config
        t0 = time.time()
        data_at_start = self.stream.state_dict()
        try:
            tasks = self._local_share(self.stream.next_batch())
            collected = await self.collector.collect(
                tasks, cfg.algorithm.group_size, seed=cfg.seed, step=self.step
            )
            trajectories, dynamic = await self._dynamic_sampling(collected, tasks)
        except asyncio.CancelledError:
            self.stream.load_state_dict(data_at_start)  # a resumed run serves this step's tasks again
            raise
        t_rollout = time.time() - t0
        if not trajectories:
            raise TrainingStopped(
                f"step {self.step}: every episode group failed ({collected.excluded_groups} excluded); "
                "see the warnings above for the episode errors"
            )
        self.engine.sleep()  # vLLM with sleep mode hands its GPU memory to the update meanwhile
        release_free_memory()  # what the rollout freed, before the update allocates
        stats, updated = self._update(trajectories)
        self.step += 1
        if updated:  # a skipped update left the weights as they were: no EMA step, nothing to push
            self._after_update()
        release_free_memory()  # what the update freed, before the next rollout and the memory metric
        return self._log_step({**collected.metrics, **dynamic}, stats, tools,
                              {"time/rollout_s": t_rollout, "time/step_s": time.time() - t0})

    def _log_step(self, rollout: dict[str, float], stats: dict[str, float], tools,
                  times: dict[str, float]) -> dict[str, float]:
        """A step's metrics row (rollout, curriculum, update, tools, times, learning rate,
        memory), logged; the tools' counters start again for the next step."""
        metrics = {
            **rollout,
            **(self.stream.metrics() if isinstance(self.stream, CurriculumStream) else {}),
            **stats,
            **tools.metrics(),
            **times,
            "train/lr": self.scheduler.get_last_lr()[0],
            **memory_metrics(self.device),
        }
        metrics = self._reduce_metrics(metrics)
        tools.reset_metrics()
        self.logger.log(metrics, self.step)
        return metrics

    def _update(self, trajectories: list) -> tuple[dict[str, float], bool]:
        """One update on `trajectories`: its metrics, and whether the weights changed (a
        non-finite loss undoes the update; too many in a row stop the run)."""
        try:
            stats = self._train_step(trajectories)
            self._nonfinite_in_a_row = 0
            return stats, True
        except NonFiniteLossError as exc:  # train_step undid the whole update
            self._nonfinite_in_a_row += 1
            log.warning("step %d: %s; update skipped (%d in a row)", self.step, exc, self._nonfinite_in_a_row)
            if self._nonfinite_in_a_row >= self.config.algorithm.max_nonfinite_steps:
                raise TrainingStopped(
                    f"{self._nonfinite_in_a_row} non-finite losses in a row: stopping "
                    "(lower algorithm.optimizer.learning_rate or check the data)"
                ) from exc
            return {"train/skipped_nonfinite": 1.0}, False

    async def _dynamic_sampling(self, collected, tasks: list) -> tuple[list, dict[str, float]]:
        """The curriculum learns from every episode played; then zero-variance groups are swapped
        for new ones (`train.dynamic_sampling`). Returns the trajectories to train on."""
        cfg = self.config
        played, all_tasks = list(collected.trajectories), list(tasks)

        async def play(n: int):
            extra_tasks = self._local_share(self.stream.next_batch(n))
            all_tasks.extend(extra_tasks)
            return await self.collector.collect(extra_tasks, cfg.algorithm.group_size, seed=cfg.seed,
                                                step=self.step + 1_000_000)  # other seeds than any step's

        trajectories, metrics, extra = await refill(self._trajectories_to_train(collected), play,
                                                    cfg.train.dynamic_sampling.max_refill_groups)
        if extra is not None:
            played += list(extra.trajectories)
            # The refill round's failures count too (its other metrics describe that round only).
            for key in ("rollout/failed_episodes", "rollout/excluded_groups", "rollout/wall_s"):
                metrics[key] = collected.metrics.get(key, 0.0) + extra.metrics.get(key, 0.0)
        metrics.update(self._record_played(played, all_tasks))
        return trajectories, metrics

    def _record_played(self, played: list, tasks: list) -> dict[str, float]:
        """The curriculum learns from every episode played; returns their success per complexity
        and per kind (curves.png draws one line each)."""
        task_ids = [task_id_of(t, i) for i, t in enumerate(tasks)]
        if isinstance(self.stream, CurriculumStream):
            self.stream.record(played, tasks, task_ids)
        grouped = grouped_success(played, tasks, task_ids, self.config.algorithm.group_size, prefix="rollout")
        return {k: v for k, v in grouped.items() if "/complexity=" in k or "/kind=" in k}

    async def _warm_start(self, tools) -> None:
        """`train.warmup`: supervised steps on gold trajectories, then the engine and the
        reference follow the warmed-up policy."""
        cfg = self.config

        def report(metrics: dict[str, float]) -> None:
            log.info("warm start %d/%d: loss %.4f, gold success %.0f%% (%.0f s)", metrics["warmup/step"],
                     cfg.train.warmup.steps, metrics["warmup/loss"], 100 * metrics["warmup/gold_success"],
                     metrics["warmup/seconds"])
            self.logger.log(metrics, 0, console=False)  # the line above is its console line

        await warm_start(self.policy, self.tokenizer, tools, cfg, self.train_tasks,
                         pad_token_id=self.tokenizer.pad_token_id, on_step=report)
        self.engine.sync_weights(self.policy)
        if self.reference is not None:
            self.reference.copy_policy()

    def _save(self) -> None:
        if self.is_main_process and self._saved_step != self.step:
            self._saved_step = self.step
            path = save_checkpoint(self.run_dir, self.step, self.checkpoint_state(),
                                   keep=self.config.train.keep_checkpoints)
            log.info("checkpoint: %s", path)

    def _write_summary(self, summary: dict[str, Any]) -> None:
        if not self.is_main_process:
            return
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        plot_curves(self.history, summary, self.run_dir / "curves.png")
        log.info("report: %s", write_report(self.run_dir))
