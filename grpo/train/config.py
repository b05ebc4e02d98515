"""Config of the run loop (`train:`: steps, evaluation, checkpoints) and of logging (`logging:`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from grpo.sections import Section


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
