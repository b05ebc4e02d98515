"""`DistributedGRPOTrainer`: GRPOTrainer on W data-parallel ranks (DDP or DeepSpeed ZeRO-3).

It overrides the trainer's hooks and nothing of the algorithm:

- tasks: every rank draws the same batch from the (identically seeded) task stream and plays
  `tasks[rank::W]`, so groups are whole on one rank and advantages are computed within them;
  ranks then keep the same number of groups (grpo/distributed/parallel.py: `balance_groups`).
- update: the unchanged `train_step` through `DataParallelPolicy` / `DeepSpeedStep`, with the
  gradient scale that makes the loss the global token (or sequence) mean; metrics are reduced
  over ranks so every rank logs (rank 0 writes) the same numbers.
- weights: the rollout engine and the EMA reference are full copies on every rank, built before
  wrapping; under ZeRO-3 they read the policy inside `GatheredParameters` (all ranks together).
- I/O: metrics, transcripts, summary and the final model are written by rank 0; checkpoints by
  every rank together (accelerate's `save_state`: ZeRO-3 optimizer partitions are per rank) plus
  rank 0's `trainer_state.pt` (EMA reference, scheduler, data position, history, step).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
from datetime import timedelta

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedDataParallelKwargs, DistributedType, InitProcessGroupKwargs

from grpo.algorithm.batching import FEWEST_CALLS
from grpo.algorithm.estimators import estimator_of
from grpo.algorithm.update import NonFiniteLossError, train_step
from grpo.config import RunConfig
from grpo.distributed.parallel import (
    DataParallelPolicy,
    DeepSpeedStep,
    DistributedLaunchError,
    TupleForward,
    balance_groups,
    gathered_parameters,
    local_denominator_scale,
    reduce_metrics,
)
from grpo.models.devices import resolve_device
from grpo.models.export import save_pretrained
from grpo.rollout.registry import choose_engine
from grpo.train.checkpoint import (
    SHARDS_DIR,
    load_checkpoint,
    resolve_resume,
    save_sharded_checkpoint,
)
from grpo.train.trainer import GRPOTrainer, TrainingStopped

log = logging.getLogger("mcp_grpo")

CHECKPOINT_FORMAT = "accelerate"


def make_accelerator(config: RunConfig, timeout_minutes: float = 30.0):
    """The run's `Accelerator` (it reads the `accelerate launch` settings from the environment)."""

    # DDP needs to be told about parameters that get no gradient: the value head when nothing
    # trains it (every advantage but `gae`).
    unused = config.model.value_head and not estimator_of(config.algorithm.advantage).needs_values
    # Without CUDA (or with device=cpu) DDP processes train on the CPU over gloo; accelerate
    # otherwise treats torchrun-started CPU processes as independent single-process runs.
    # (`cpu=True` would turn DeepSpeed off: its accelerate config says `use_cpu` itself.)
    deepspeed = os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true"
    on_cpu = config.device == "cpu" or not torch.cuda.is_available()
    group = {"timeout": timedelta(minutes=timeout_minutes)}
    if deepspeed and on_cpu:
        # Without a backend named here accelerate starts DeepSpeed's gloo group but then counts
        # one process per rank (each would think it is rank 0 of 1).
        group["backend"] = "gloo"
    return Accelerator(cpu=on_cpu and not deepspeed, kwargs_handlers=[
        DistributedDataParallelKwargs(find_unused_parameters=unused),
        InitProcessGroupKwargs(**group),
    ])


class DistributedGRPOTrainer(GRPOTrainer):
    """GRPOTrainer for `accelerate launch` (see the module docstring)."""

    def __init__(self, config: RunConfig, *, accelerator=None):
        super().__init__(config)

        self.accelerator = accelerator or make_accelerator(config)
        self.rank = self.accelerator.process_index
        self.world_size = self.accelerator.num_processes
        self.uses_deepspeed = self.accelerator.distributed_type == DistributedType.DEEPSPEED
        self._dropped_groups = 0
        launched = int(os.environ.get("WORLD_SIZE", "1"))
        if launched != self.world_size:
            # Each process would act as rank 0 of 1 and write the same files.
            raise DistributedLaunchError(
                f"the launcher started {launched} processes but accelerate sees "
                f"{self.world_size} ({self.accelerator.distributed_type.value}); check the "
                "accelerate config (distributed_type, use_cpu) and that CUDA/DeepSpeed are usable"
            )
        self._check_config()

    def _check_config(self) -> None:
        cfg = self.config
        if cfg.train.tasks_per_step % self.world_size:
            raise ValueError(
                f"train.tasks_per_step={cfg.train.tasks_per_step} must be a multiple of the "
                f"{self.world_size} processes: every rank plays the same number of whole groups"
            )
        if cfg.train.async_rollouts.enabled:
            raise ValueError(
                "train.async_rollouts with launch/distributed.py: every rank's update takes part in "
                "collectives, so ranks must take their groups in step, which the per-process producer "
                "does not arrange yet; run it with one process (launch/train.py), or set "
                "train.async_rollouts.enabled=false"
            )
        optimizer = cfg.algorithm.optimizer
        for name in ("micro_batch_tokens", "micro_batch_overhead_tokens"):
            if getattr(optimizer, name) is not None:
                raise ValueError(
                    f"algorithm.optimizer.{name}={getattr(optimizer, name)} cuts micro-batches by "
                    "the lengths of a rank's own sequences, so ranks could run different numbers "
                    "of forwards and backwards, and the collectives inside them would wait forever. "
                    "launch/distributed.py cuts each rank's rows into ceil(rows / micro_batch_size) "
                    f"micro-batches (the least padding among those cuts): leave {name} null"
                )
        if self.uses_deepspeed and cfg.train.warmup.steps:
            raise ValueError(
                f"train.warmup.steps={cfg.train.warmup.steps} with DeepSpeed: the warm start "
                "trains the policy with its own AdamW outside DeepSpeed's engine, whose ZeRO "
                "hooks keep the gradients (and under stage 3 the weights) to themselves, so it "
                "would not train; run the warm start without DeepSpeed (one process, or "
                "`accelerate launch --multi_gpu`), or set train.warmup.steps=0"
            )
        if self.uses_deepspeed and cfg.lora.enabled:
            raise ValueError(
                "lora.enabled with DeepSpeed ZeRO-3 is not supported (the LoRA EMA reference scores "
                "through the partitioned policy); use plain DDP (`accelerate launch --multi_gpu`) "
                "for LoRA runs"
            )
        if cfg.rollout.engine != "hf":
            engine, why = choose_engine(cfg.rollout.engine, resolve_device(cfg.device)[0])
            if engine == "vllm":
                raise ValueError(
                    f"rollout.engine={cfg.rollout.engine} chose vllm ({why}), which "
                    "launch/distributed.py does not support yet; set rollout.engine: hf"
                )

    # ------------------------------------------------------------------ wrapping
    def _configure_deepspeed(self) -> None:
        """Values of the DeepSpeed config that follow from the run config."""
        plugin = self.accelerator.state.deepspeed_plugin
        ds_config = plugin.deepspeed_config
        stage = ds_config.get("zero_optimization", {}).get("stage", 0)
        if stage == 0:
            raise ValueError("the DeepSpeed config needs zero_optimization.stage 1, 2 or 3 (0 found)")
        gas = ds_config.get("gradient_accumulation_steps", 1)
        if gas not in (1, "auto"):
            raise ValueError(
                f"DeepSpeed gradient_accumulation_steps={gas}: set it to 1; train_step accumulates "
                "micro-batches itself (algorithm.optimizer.micro_batch_size / num_minibatches)"
            )
        ds_config["gradient_accumulation_steps"] = 1
        ds_config["gradient_clipping"] = self.config.algorithm.optimizer.max_grad_norm
        ds_config["train_micro_batch_size_per_gpu"] = self.config.algorithm.optimizer.micro_batch_size
        ds_config.pop("train_batch_size", None)  # DeepSpeed derives it: micro x 1 x ranks

    def _wrap_for_training(self) -> None:
        if self.uses_deepspeed:
            self._configure_deepspeed()
        self.wrapped, optimizer = self.accelerator.prepare(TupleForward(self.policy), self.optimizer)
        self.dp_policy = DataParallelPolicy(self.policy, self.wrapped)
        self.step_optimizer = DeepSpeedStep(self.wrapped) if self.uses_deepspeed else optimizer
        if self.uses_deepspeed and not getattr(self.wrapped, "_support_torch_style_backward", False):
            raise RuntimeError(
                "this DeepSpeed/torch pair does not support calling loss.backward() directly, "
                "which train_step does; use deepspeed>=0.18 with torch>=2.4"
            )
        if self.uses_deepspeed and self.scaler is not None:
            raise ValueError(
                "fp16 compute (model.dtype float16, or auto on a GPU without bf16) needs loss "
                "scaling, which this run does through torch's GradScaler; DeepSpeed's partitioned "
                "gradients are out of its reach. Use model.dtype: bfloat16 or float32, or plain DDP"
            )
        # Skipping zero-advantage sequences would give ranks different numbers of forwards (it
        # never changes the objective: it happens only where those sequences have no gradient).
        # A non-finite loss stops a data-parallel run, so no rollback copy is kept.
        # For the same reason the micro-batch cuts count calls first (FEWEST_CALLS), not padding.
        self.settings = dataclasses.replace(
            self.settings, skip_zero_advantage=False, rollback_on_nonfinite=False,
            schedule=self.settings.schedule.model_copy(update={"micro_batch_overhead_tokens": FEWEST_CALLS}))
        self._sync_engine()
        kind = (f"DeepSpeed ZeRO-{self.accelerator.state.deepspeed_plugin.zero_stage}"
                if self.uses_deepspeed else self.accelerator.distributed_type.value)
        log.info("data parallel: %d processes, %s", self.world_size, kind)

    def _sync_engine(self) -> None:
        with gathered_parameters(self.policy, self.uses_deepspeed):
            self.engine.sync_weights(self.policy)

    # ------------------------------------------------------------------ hooks
    def _local_share(self, tasks: list) -> list:
        return list(tasks)[self.rank :: self.world_size]

    def _trajectories_to_train(self, collected) -> list:
        kept, self._dropped_groups = balance_groups(collected.trajectories)
        if self._dropped_groups:
            log.warning("rank %d: dropped %d group(s) so every rank trains on the same number",
                        self.rank, self._dropped_groups)
        return kept

    def _train_step(self, trajectories: list) -> dict[str, float]:
        scale = local_denominator_scale(trajectories, self.settings.loss.loss_agg)
        self.dp_policy.grad_scale = scale
        try:
            stats = train_step(
                self.dp_policy, self.reference, self.step_optimizer, self.scheduler,
                trajectories, self.settings, check_logprobs=(self.step == 0), scaler=self.scaler,
            )
        except NonFiniteLossError as exc:
            # One rank alone cannot skip an update: the others would wait in their next
            # collective. Stop; the launcher then ends every rank.
            raise TrainingStopped(
                f"rank {self.rank}, step {self.step}: {exc}; a data-parallel run stops instead of "
                "skipping the update (lower algorithm.optimizer.learning_rate or check the data)"
            ) from exc
        finally:
            self.dp_policy.grad_scale = 1.0
        if isinstance(self.step_optimizer, DeepSpeedStep):
            # DeepSpeed clips inside its step; train_step saw no .grad (it lives in partitions).
            norms = self.step_optimizer.grad_norms
            stats["train/grad_norm"] = sum(norms) / len(norms) if norms else 0.0
            norms.clear()
        stats["train/denominator_scale"] = scale
        stats["train/dropped_groups"] = float(self._dropped_groups)
        return stats

    def _after_update(self) -> None:
        with gathered_parameters(self.policy, self.uses_deepspeed):
            super()._after_update()

    def _reduce_metrics(self, metrics: dict[str, float], weight: float = 1.0) -> dict[str, float]:
        return reduce_metrics(metrics, weight)

    def _save_final_model(self) -> None:
        with gathered_parameters(self.policy, self.uses_deepspeed):
            if self.accelerator.is_main_process:
                save_pretrained(self.policy, self.run_dir / "final_model", tokenizer=self.tokenizer)
        self.accelerator.wait_for_everyone()

    def parameter_digest(self) -> str:
        """sha256 of the policy's full parameters (gathered under ZeRO-3); all ranks call it."""
        digest = hashlib.sha256()
        with gathered_parameters(self.policy, self.uses_deepspeed):
            for name, tensor in sorted(self.policy.state_dict().items()):
                digest.update(name.encode())
                digest.update(tensor.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
        return digest.hexdigest()

    # ------------------------------------------------------------------ checkpoints
    def checkpoint_state(self) -> dict:
        """What rank 0 writes beside accelerate's state (policy and optimizer live there)."""
        return {
            "format": CHECKPOINT_FORMAT,
            "world_size": self.world_size,
            "deepspeed": self.uses_deepspeed,
            "reference": self.reference.state_dict() if self.reference is not None else None,
            "scheduler": self.scheduler.state_dict(),
            "grad_scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "data": self.stream.state_dict(),
            "history": self.history,
        }

    def _save(self) -> None:
        if self._saved_step == self.step:
            return
        self._saved_step = self.step
        acc = self.accelerator
        path = save_sharded_checkpoint(
            self.run_dir, self.step, self.checkpoint_state(),
            # Pickle, not safetensors: tied embeddings share storage, which safetensors refuses.
            lambda directory: acc.save_state(str(directory), safe_serialization=False),
            is_main_process=acc.is_main_process, barrier=acc.wait_for_everyone,
            keep=self.config.train.keep_checkpoints,
        )
        log.info("checkpoint: %s", path)

    def _save_on_interrupt(self) -> None:
        """Nothing: the sharded save is collective, and an interrupted rank cannot know that its
        peers stopped at the same step (they would wait for it forever). `train.save_every` keeps
        a data-parallel run's progress."""

    def _maybe_resume(self) -> None:
        path = resolve_resume(self.config.train.resume, self.run_dir)
        if path is None:
            return
        state = load_checkpoint(path)
        if state.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(f"{path} was written by a single-process run; resume it with "
                             "`python -m launch.train ... train.resume=...`")
        if state["deepspeed"] != self.uses_deepspeed or (
                self.uses_deepspeed and state["world_size"] != self.world_size):
            raise ValueError(
                f"{path} was written with deepspeed={state['deepspeed']} on {state['world_size']} "
                f"processes; this run has deepspeed={self.uses_deepspeed} on {self.world_size} "
                "(ZeRO partitions are per rank: resume with the same launch settings)"
            )
        # Policy, optimizer and every rank's own RNG state.
        self.accelerator.load_state(str(path / SHARDS_DIR))
        if self.reference is not None and state.get("reference") is not None:
            self.reference.load_state_dict(state["reference"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.scaler is not None and state.get("grad_scaler") is not None:
            self.scaler.load_state_dict(state["grad_scaler"])
        self.stream.load_state_dict(state["data"])
        self.history = state.get("history", [])
        self.step = state["step"]
        self.logger.truncate_after(self.step)  # rank 0's metrics.jsonl; a no-op elsewhere
        self._sync_engine()
        log.info("resumed from %s at step %d", path, self.step)
