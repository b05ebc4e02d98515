"""The algorithm's config, in sections: `advantage`, `loss`, `optimizer`, `reference`.

`advantage` is a discriminated union on `estimator`: the outcome estimators (`grpo`, `dr_grpo`,
`rloo`) have no discount, and GAE's `gamma` and `lam` exist only when `estimator: gae`. A bare
string (`advantage: rloo`) is read as `{estimator: rloo}`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator

from grpo.sections import Section


class OutcomeAdvantageConfig(Section):
    """One advantage per episode from the group's rewards, broadcast over its sampled tokens."""

    estimator: Literal["grpo", "dr_grpo", "rloo"] = "grpo"
    """`grpo`: (r - group mean) / group std; `dr_grpo`: r - group mean; `rloo`: r - mean of the
    other G - 1 rewards of the group."""
    normalize_std: bool = True
    """`grpo` only: divide by the group's reward std (zero-variance groups give A = 0)."""


class GAEConfig(Section):
    """Token-level GAE with the policy's value head (needs `model.value_head: true`)."""

    estimator: Literal["gae"] = "gae"
    gamma: float = Field(default=0.99, ge=0.0, le=1.0)
    """Discount per token."""
    lam: float = Field(default=0.95, ge=0.0, le=1.0)
    """GAE lambda."""


AdvantageConfig = Annotated[OutcomeAdvantageConfig | GAEConfig, Field(discriminator="estimator")]


class LossConfig(Section):
    clip_low: float = Field(default=0.2, ge=0.0)
    """Lower clip: ratios below 1 - clip_low are clipped."""
    clip_high: float = Field(default=0.2, ge=0.0)
    """Upper clip: ratios above 1 + clip_high are clipped (> clip_low is 'clip-higher')."""
    dual_clip: float | None = Field(default=None, gt=1.0)
    """Dual-clip constant c (> 1) bounding the loss of negative-advantage tokens; off when null."""
    value_coef: float = Field(default=0.5, ge=0.0)
    """Weight of the value-head loss (used when the value head is trained, e.g. with `gae`)."""
    value_clip: float | None = Field(default=0.2, gt=0.0)
    """Clip range of value predictions around the old values; null disables."""
    entropy_coef: float = Field(default=0.0, ge=0.0)
    """Weight of the entropy bonus."""
    loss_agg: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"] = "token_mean"
    """How per-token losses are aggregated (see grpo/algorithm/loss.py for each denominator)."""
    skip_zero_advantage: bool = True
    """Skip the forward/backward of sequences whose advantage is exactly 0 (e.g. every episode of
    a group got the same reward) when nothing else would move them: never with an entropy bonus,
    GAE, or the KL in the reward. The loss denominator still counts them."""


class OptimizerConfig(Section):
    learning_rate: float = Field(default=5e-6, gt=0.0)
    """Peak learning rate (AdamW)."""
    weight_decay: float = Field(default=0.0, ge=0.0)
    """AdamW weight decay."""
    warmup_steps: int = Field(default=0, ge=0)
    """Linear warmup in optimizer steps, then constant."""
    max_grad_norm: float = Field(default=1.0, gt=0.0)
    """Gradient-norm clip."""
    ppo_epochs: int = Field(default=1, ge=1)
    """Passes over each collected batch."""
    num_minibatches: int = Field(default=1, ge=1)
    """Optimizer steps per epoch; each minibatch is split into micro-batches."""
    micro_batch_size: int = Field(default=8, ge=1)
    """Sequences per forward/backward (gradient accumulation fills the minibatch)."""


class ReferenceConfig(Section):
    """The EMA reference policy and the KL that pulls the policy toward it."""

    kl: Literal["off", "loss", "reward"] = "loss"
    """Where KL(policy || reference) acts: `loss` adds kl_coef * KL to the loss, `reward`
    subtracts kl_coef * KL from the token rewards, `off` builds no reference at all."""
    kl_coef: float = Field(default=0.01, gt=0.0)
    """Weight of the KL term (unused with `kl: off`)."""
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    """Per-token KL estimator (Schulman's k1, k2, k3)."""
    ema_decay: float = Field(default=0.99, ge=0.0, le=1.0)
    """ref <- decay * ref + (1 - decay) * policy. 1 freezes it, 0 copies."""
    update_every: int = Field(default=100, ge=1)
    """Training steps between EMA reference updates."""
    offload_to_cpu: bool = False
    """Full fine-tuning: keep the reference copy on the CPU (saves accelerator memory)."""


class AlgorithmConfig(Section):
    group_size: int = Field(default=4, ge=2)
    """G: episodes sampled per task; advantages are computed within each group."""
    advantage: AdvantageConfig = Field(default_factory=OutcomeAdvantageConfig)
    """How advantages are computed (`estimator: grpo | dr_grpo | rloo | gae`)."""
    loss: LossConfig = Field(default_factory=LossConfig)
    """The PPO surrogate, value and entropy terms and their aggregation."""
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    """AdamW and the update schedule (epochs, minibatches, micro-batches)."""
    reference: ReferenceConfig = Field(default_factory=ReferenceConfig)
    """The EMA reference and the KL to it."""
    logprob_tolerance: float = Field(default=0.05, gt=0.0)
    """Step-0 health check: mean |trainer - engine| log-prob of sampled tokens must be below this."""
    max_nonfinite_steps: int = Field(default=3, ge=1)
    """Consecutive non-finite losses that stop the run."""

    @field_validator("advantage", mode="before")
    @classmethod
    def _estimator_shorthand(cls, value: Any) -> Any:
        # `advantage: rloo` means {estimator: rloo}; a mapping without one means the default.
        if isinstance(value, str):
            return {"estimator": value}
        if isinstance(value, dict) and "estimator" not in value:
            return {"estimator": "grpo", **value}
        return value

    @property
    def uses_reference(self) -> bool:
        """Whether anything scores tokens under the reference (the KL is on)."""
        return self.reference.kl != "off"
