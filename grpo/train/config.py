"""Config of the run loop (`train:`: steps, evaluation, checkpoints) and of logging (`logging:`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from grpo.sections import Section


class WarmupConfig(Section):
    """Supervised warm start on gold trajectories before GRPO (grpo/train/warmup.py)."""

    steps: int = Field(default=0, ge=0)
    """Optimizer steps of the warm start; 0 turns it off."""
    tasks_per_step: int = Field(default=16, ge=1)
    """Gold trajectories per warm-start step (training tasks, in the task stream's order)."""
    learning_rate: float = Field(default=2e-5, gt=0.0)
    """AdamW learning rate of the warm start (its own optimizer; GRPO's starts fresh after it)."""
    balance: Literal["chain_length", "none"] = "chain_length"
    """`chain_length`: each batch takes tasks of every gold chain length in turn; `none`: a
    shuffled pass over the training tasks."""
    max_minutes: float | None = Field(default=None, ge=0.0)
    """Stop the warm start once a step ends past this many minutes of it (the first step always
    runs), so a run's time budget holds on a slower machine too; null: `steps` alone."""
    eval_after: bool = False
    """Evaluate held-out success right after the warm start as well (summary.json
    `success_warmup`, beside `success_before` and `success_after`)."""


class CurriculumConfig(Section):
    """Serve training tasks by learnability (grpo/train/curriculum.py) instead of a shuffled pass."""

    enabled: bool = False
    """Weight buckets (complexity x tools) by max(p (1 - p), floor); start from one-call tasks."""
    floor: float = Field(default=0.05, gt=0.0, le=0.25)
    """Least weight of a bucket before normalising (solved and hopeless buckets keep it)."""
    ema: float = Field(default=0.3, gt=0.0, le=1.0)
    """Weight of the newest step's success in a bucket's running success rate."""
    start: Literal["simplest", "all"] = "simplest"
    """Success assumed before a bucket is played: `simplest` (0.5 for the simplest complexity, 0
    for the rest: start on one-call tasks) or `all` (0.5 everywhere: every bucket is tried, e.g.
    after a warm start that already taught long chains)."""


class DynamicSamplingConfig(Section):
    """Drop groups whose rewards are all equal (no GRPO signal) and play new tasks instead."""

    max_refill_groups: int = Field(default=0, ge=0)
    """Most replacement groups per step, played in one extra round; 0 turns it off."""


class AsyncRolloutsConfig(Section):
    """Rollouts that overlap with updates (grpo/train/pipeline.py): a producer keeps playing
    groups with the newest weights the engine has while the trainer updates on finished ones."""

    enabled: bool = False
    """Play and update at once; off: each step collects, then updates, then pushes weights."""
    max_staleness: int = Field(default=1, ge=0)
    """Most updates a group's sampling weights may lag the trainer's (older groups are dropped and
    counted); the behaviour correction (`algorithm.behavior_correction`) weights the rest."""
    round_tasks: int | None = Field(default=None, ge=1)
    """Tasks the producer plays per round (weights reach the engine between rounds); null:
    `train.tasks_per_step`."""
    max_queue_groups: int | None = Field(default=None, ge=1)
    """Most finished groups waiting for the trainer; the producer pauses while the queue is
    full (fresher weights are coming). Null: `train.tasks_per_step`."""


class TrainConfig(Section):
    steps: int = Field(default=10, ge=0)
    """Training steps (one step = collect, advantages, update)."""
    tasks_per_step: int = Field(default=8, ge=1)
    """Tasks per step; each yields `algorithm.group_size` episodes."""
    eval_before: bool = True
    """Evaluate held-out success before training."""
    eval_after: bool = True
    """Evaluate held-out success after training."""
    eval_every: int = Field(default=0, ge=0)
    """Evaluate every N steps (0 = only before/after)."""
    eval_tasks: int | None = Field(default=None, ge=1)
    """Cap on held-out tasks evaluated (null = the whole validation split)."""
    save_every: int = Field(default=0, ge=0)
    """Checkpoint every N steps (0 = only at the end)."""
    keep_checkpoints: int = Field(default=2, ge=1)
    """Most recent checkpoints kept."""
    resume: str | None = None
    """`auto` (latest checkpoint in the run directory) or a checkpoint path."""
    save_final_model: bool = True
    """Write the final model in HF format (merged, plus the adapter for LoRA runs)."""
    max_minutes: float | None = Field(default=None, gt=0)
    """Wall-clock budget of the training loop: no new step starts after it (evaluations and the
    warm start count toward it); null = run all `steps`."""
    warmup: WarmupConfig = Field(default_factory=WarmupConfig)
    """Optional supervised warm start on gold trajectories."""
    curriculum: CurriculumConfig = Field(default_factory=CurriculumConfig)
    """Optional learnability curriculum over the training tasks."""
    dynamic_sampling: DynamicSamplingConfig = Field(default_factory=DynamicSamplingConfig)
    """Optional replacement of zero-variance groups."""
    async_rollouts: AsyncRolloutsConfig = Field(default_factory=AsyncRolloutsConfig)
    """Optional overlap of rollouts with updates, bounded by staleness."""


class WandbConfig(Section):
    enabled: bool = False
    """Log to Weights & Biases (offline mode when WANDB_API_KEY is not set)."""
    project: str = "mcp-grpo"
    """wandb project."""
    entity: str | None = None
    """wandb entity."""
    mode: Literal["online", "offline", "auto"] = "auto"
    """`auto`: online when WANDB_API_KEY is set, else offline."""


class LoggingConfig(Section):
    log_every: int = Field(default=1, ge=1)
    """Steps between console lines (metrics.jsonl gets every step)."""
    wandb: WandbConfig = Field(default_factory=WandbConfig)
    """Weights & Biases settings."""
    progress: bool = True
    """Show rich progress bars."""
    token_samples: bool = True
    """Keep one trajectory per training step, token by token, for the run report's token view
    (`samples/tokens.jsonl`; costs one scoring pass of that row when the step makes none)."""
