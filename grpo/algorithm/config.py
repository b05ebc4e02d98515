"""The algorithm's config, in sections: `advantage`, `loss`, `optimizer`, `reference`,
`behavior_correction`.

`advantage` is a discriminated union on `estimator`: the outcome estimators (`grpo`, `dr_grpo`,
`rloo`) have no discount, and GAE's `gamma` and `lam` exist only when `estimator: gae`. A bare
string (`advantage: rloo`) is read as `{estimator: rloo}`, and `behavior_correction: off` as
`{mode: off}` (YAML reads a bare `off` as false; both spellings work).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from grpo.sections import Section


class OutcomeAdvantageConfig(Section):
    """One advantage per episode from the group's rewards, broadcast over its sampled tokens."""

    estimator: Literal["grpo", "dr_grpo", "rloo"] = "grpo"
    """`grpo`: (r - group mean) / group std; `dr_grpo`: r - group mean; `rloo`: r - mean of the
    other G - 1 rewards of the group."""
    normalize_std: bool = True
    """`grpo` only: divide by the group's reward std (zero-variance groups give A = 0)."""


class GAEConfig(Section):
    """Token-level GAE with the policy's value head (needs `model.value_head: true`).

    The time step is one sampled token, so a per-token discount compounds over hundreds of steps:
    gamma 0.99 and lam 0.95 give the first of 128 tokens 4e-4 of a final reward (2e-14 at 512)
    while the value head is still near 0. Hence gamma = lam = 1 by default: the advantage is the
    reward-to-go minus the value. VC-PPO and VAPO likewise fit the value head with lambda 1
    (`value_lam`) even where the policy uses a lower one."""

    estimator: Literal["gae"] = "gae"
    gamma: float = Field(default=1.0, ge=0.0, le=1.0)
    """Discount per sampled token."""
    lam: float = Field(default=1.0, ge=0.0, le=1.0)
    """GAE lambda of the advantages (the policy's credit assignment)."""
    value_lam: float | None = Field(default=None, ge=0.0, le=1.0)
    """GAE lambda of the value targets, decoupled from `lam` (VC-PPO / VAPO train the critic
    with 1.0 while the policy uses a lower lambda); null = `lam`."""
    whiten: bool = False
    """Whiten the step's advantages over all its sampled tokens (mean 0, std 1). With data
    parallelism each rank whitens its own share, so the update then depends slightly on the
    number of ranks."""


class TurnAdvantageConfig(Section):
    """Turn-level GRPO (grpo/algorithm/turn_advantages.py): the episode's outcome advantage, as
    `grpo` gives it, on every sampled token, plus on each turn's tokens the advantage of that
    turn's credit units (its tool calls, verified against the gold chain by the environment:
    `environment.turn_credit: verified`), each normalised among the group's units of the same
    progress. A turn without units (the final answer, or an environment that gives none) gets
    the outcome advantage alone, so with no units at all this is `grpo`."""

    estimator: Literal["turn_grpo"] = "turn_grpo"
    normalize_std: bool = True
    """Divide the outcome advantages by the group's reward std and each unit's advantage by the
    std of its key's units (zero-variance groups and keys give exactly 0)."""
    turn_weight: float = Field(default=1.0, ge=0.0)
    """Weight of the turn advantage added to the outcome one (GiGPO's omega); 0 is `grpo`."""


AdvantageConfig = Annotated[OutcomeAdvantageConfig | TurnAdvantageConfig | GAEConfig, Field(discriminator="estimator")]


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
    a group got the same reward) when nothing else would move them: only with outcome advantages,
    no entropy bonus and `reference.kl: off` (with the KL in the loss such a sequence still has a
    KL gradient; in the reward, a KL penalty that makes its advantage non-zero). The loss
    denominator still counts them, so skipping never changes the update."""


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
    micro_batch_tokens: int | None = Field(default=None, ge=1)
    """Also cap each micro-batch at this many padded tokens (rows x its longest sequence; rows
    are length-sorted first), so short sequences share a forward and long ones do not exceed
    memory. null: only `micro_batch_size` counts. The loss is normalized over the whole
    minibatch, so how rows are grouped changes speed and memory, not the update."""
    micro_batch_overhead_tokens: int | None = Field(default=None, ge=0)
    """What one more micro-batch costs, counted in padded tokens. Within the two caps above, the
    length-sorted rows are cut where that costs least: padded tokens + this per micro-batch, so
    a few long rows get their own forward instead of padding every short one to their length.
    null: the device's default (256 on a CPU, where a full fine-tune's call costs ~0.34 s of
    weight-sized work, as much as ~256 tokens; 4096 on CUDA and 1024 on MPS, estimates). LoRA
    runs, whose calls carry little weight-sized work, can set it lower."""


class ReferenceConfig(Section):
    """The EMA reference policy and the KL that pulls the policy toward it."""

    kl: Literal["off", "loss", "reward"] = "loss"
    """Where the KL to the reference acts: `loss` adds kl_coef * KL to the loss, `reward`
    subtracts kl_coef * KL(policy || reference) from the token rewards, `off` builds no
    reference at all."""
    kl_coef: float = Field(default=0.01, gt=0.0)
    """Weight of the KL term (unused with `kl: off`)."""
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    """Per-token estimator (Schulman's k1, k2, k3; log_r = log ref - log policy). As a value
    (`kl: reward`) each estimates KL(policy || ref): k1 = -log_r and k3 = e^log_r - 1 - log_r
    without bias, k2 = log_r^2 / 2 with a small bias. As a loss term (`kl: loss`) what counts is
    the expected gradient over sampled tokens: k3's is that of KL(ref || policy) (mass-covering),
    k2's that of KL(policy || ref), and k1's is zero (pure noise), so k1 is refused there."""
    ema_decay: float = Field(default=0.99, ge=0.0, le=1.0)
    """ref <- decay * ref + (1 - decay) * policy. 1 freezes it, 0 copies."""
    update_every: int = Field(default=100, ge=1)
    """Training steps between EMA reference updates."""
    offload_to_cpu: bool = False
    """Full fine-tuning: keep the reference copy on the CPU (saves accelerator memory); it moves
    to the accelerator once per scoring pass."""

    @field_validator("kl", mode="before")
    @classmethod
    def _yaml_off(cls, value: Any) -> Any:
        return "off" if value is False else value  # YAML 1.1 reads a bare `off` as false

    @model_validator(mode="after")
    def _no_k1_in_the_loss(self) -> ReferenceConfig:
        if self.kl == "loss" and self.kl_estimator == "k1":
            raise ValueError(K1_IN_LOSS)
        return self


K1_IN_LOSS = (
    "kl_estimator k1 in the loss has zero expected gradient (E[grad log pi] = 0): it adds noise, "
    "not a pull toward the reference. Use k3 (gradient of KL(ref || policy)) or k2 (gradient "
    "of KL(policy || ref)) with kl: loss, or k1 with kl: reward"
)


class BehaviorCorrectionConfig(Section):
    """Importance correction for the gap between the rollout engine that sampled the tokens and
    the trainer that scores them (grpo/algorithm/correction.py). Per sampled token
    rho = pi_old / pi_behavior (trainer before the update / engine at sample time)."""

    mode: Literal["off", "tis", "mis"] = "tis"
    """`tis`: each token's policy and KL terms are weighted by min(rho, clip) (truncated
    importance sampling); `mis`: by rho, or 0 where rho > clip (masked); `off`: no weights, the
    update ignores the engine's log-probs (they feed only metrics and the step-0 check)."""
    clip: float = Field(default=2.0, ge=1.0)
    """C: the bound on a token's weight (truncated with `tis`, masked above with `mis`)."""
    max_sequence_kl: float | None = Field(default=0.05, gt=0.0)
    """Reject (weight 0) every token of a sequence whose mean per-token mismatch KL(behavior ||
    old) exceeds this; null never rejects. 0.05 is ~40x the mismatch the step-0 check allows
    for a whole batch (mean |log-prob difference| 0.05)."""


class AlgorithmConfig(Section):
    group_size: int = Field(default=4, ge=2)
    """G: episodes sampled per task; advantages are computed within each group."""
    advantage: AdvantageConfig = Field(default_factory=OutcomeAdvantageConfig)
    """How advantages are computed (`estimator: grpo | dr_grpo | rloo | turn_grpo | gae`)."""
    loss: LossConfig = Field(default_factory=LossConfig)
    """The PPO surrogate, value and entropy terms and their aggregation."""
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    """AdamW and the update schedule (epochs, minibatches, micro-batches)."""
    reference: ReferenceConfig = Field(default_factory=ReferenceConfig)
    """The EMA reference and the KL to it."""
    behavior_correction: BehaviorCorrectionConfig = Field(default_factory=BehaviorCorrectionConfig)
    """Importance weights for the sampler/trainer gap (`mode: off | tis | mis`)."""
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

    @field_validator("behavior_correction", mode="before")
    @classmethod
    def _mode_shorthand(cls, value: Any) -> Any:
        # `behavior_correction: tis` means {mode: tis}; YAML reads a bare `off` as false.
        if value is False:
            return {"mode": "off"}
        return {"mode": value} if isinstance(value, str) else value

    @property
    def uses_reference(self) -> bool:
        """Whether anything scores tokens under the reference (the KL is on)."""
        return self.reference.kl != "off"
