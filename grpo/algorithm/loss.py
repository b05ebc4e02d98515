"""The training loss as pure functions of tensors.

This module owns the per-token terms (PPO clipped surrogate with clip-higher and dual-clip, KL to
the EMA reference with Schulman's k1/k2/k3 estimators, the clipped value loss, the entropy bonus),
how per-token terms become one scalar (the aggregation modes and their denominator), and
`compute_policy_loss`, which combines them, weighted by the behaviour-correction weights
(grpo/algorithm/correction.py) when given, and returns `(loss, detached metrics)`.

Shapes: B sequences, T target positions. Every log-prob is already aligned to the token it scores,
so all per-token tensors are [B, T] and `loss_mask` is 1 exactly on the tokens the policy sampled.
Log-probs are named by who computed them: `policy_` (trainer, now, with grad), `old_` (trainer,
before this update), `ref_` (EMA reference), `behavior_` (rollout engine).

Nothing here calls a model, reads a config object, talks to other ranks or logs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import torch

if TYPE_CHECKING:
    from grpo.algorithm.config import AlgorithmConfig

LOSS_AGG_MODES: tuple[str, ...] = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")
KL_ESTIMATORS: tuple[str, ...] = ("k1", "k2", "k3")

# exp() of a log-ratio beyond this overflows nothing in fp32 (e^20 ~ 5e8) and never binds on
# tokens whose probabilities are within a factor of 10^8 of each other.
_MAX_LOG_RATIO = 20.0


@dataclass(frozen=True)
class LossSettings:
    """The loss options as plain values (see grpo/algorithm/config.py for each field's meaning),
    built by `from_config` from sections pydantic has checked; nothing here checks them again."""

    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = None
    kl: str = "loss"
    """Where the KL to the reference acts: `loss`, `reward` (a penalty on rewards) or `off`."""
    kl_coef: float = 0.01
    kl_estimator: str = "k3"
    value_coef: float = 0.5
    value_clip: float | None = 0.2
    entropy_coef: float = 0.0
    loss_agg: str = "token_mean"
    norm_length: float | None = None
    """L of `seq_mean_token_sum_norm` (Dr. GRPO): a constant, e.g. the most tokens a trajectory
    may generate. Required by that mode, unused by the others."""

    @property
    def kl_in_loss(self) -> bool:
        """Whether the KL to the reference is a loss term (else a reward penalty, or off)."""
        return self.kl == "loss"

    @classmethod
    def from_config(
        cls, algorithm: AlgorithmConfig, norm_length: float | None = None
    ) -> LossSettings:
        loss, reference = algorithm.loss, algorithm.reference
        return cls(
            clip_low=loss.clip_low,
            clip_high=loss.clip_high,
            dual_clip=loss.dual_clip,
            kl=reference.kl,
            kl_coef=reference.kl_coef,
            kl_estimator=reference.kl_estimator,
            value_coef=loss.value_coef,
            value_clip=loss.value_clip,
            entropy_coef=loss.entropy_coef,
            loss_agg=loss.loss_agg,
            norm_length=norm_length,
        )


@dataclass
class LossInputs:
    """Named tensors of one (micro-)batch. Values at positions where loss_mask is 0 are ignored
    (they may be anything, even NaN)."""

    policy_logprobs: torch.Tensor
    """[B, T] log-prob of each target token under the policy now; carries the gradient."""
    old_logprobs: torch.Tensor
    """[B, T] the same under the trainer's weights before this update (no grad)."""
    advantages: torch.Tensor
    """[B, T] per-token advantages, or [B] per-sequence advantages broadcast over tokens."""
    loss_mask: torch.Tensor
    """[B, T] bool or float, 1 on the tokens the policy sampled."""
    ref_logprobs: torch.Tensor | None = None
    """[B, T] the same under the EMA reference (no grad); needed when the KL is in the loss."""
    entropy: torch.Tensor | None = None
    """[B, T] entropy of the policy's next-token distribution at each position (with grad)."""
    values: torch.Tensor | None = None
    """[B, T] value-head predictions now (with grad); enables the value loss."""
    old_values: torch.Tensor | None = None
    """[B, T] value-head predictions before this update (needed when value_clip is set)."""
    returns: torch.Tensor | None = None
    """[B, T] value targets (e.g. GAE returns); needed with `values`."""
    is_weights: torch.Tensor | None = None
    """[B, T] behaviour-correction weights (no grad, grpo/algorithm/correction.py) multiplying
    each token's policy and KL terms; None: every weight is 1."""


# ---------------------------------------------------------------------------------------------
# Aggregation: per-token [B, T] -> scalar
# ---------------------------------------------------------------------------------------------


def loss_denominator(loss_masks: torch.Tensor | Sequence[torch.Tensor], loss_agg: str) -> float:
    """The denominator of `loss_agg` over a whole minibatch: the one place it is defined.

    Pass every micro-batch's mask ([B_i, T_i] each; widths may differ) and give the result to each
    micro-batch's loss: the micro-batch losses then sum to the loss of the whole minibatch computed
    at once, so gradient accumulation needs no rescaling. With data parallelism, all-reduce (sum)
    this number over ranks and multiply each rank's loss by the world size (DDP averages grads).

    What it counts:
    - `token_mean`: unmasked tokens in the minibatch (every sampled token weighs the same).
    - `seq_mean_token_mean`, `seq_mean_token_sum_norm`: sequences with at least one unmasked
      token (a sequence with nothing to learn from is not a sample of the mean).
    """
    if loss_agg not in LOSS_AGG_MODES:
        raise ValueError(f"loss_agg {loss_agg!r} is unknown; options: {LOSS_AGG_MODES}")
    masks = [loss_masks] if isinstance(loss_masks, torch.Tensor) else list(loss_masks)
    total = 0
    for mask in masks:
        mask = mask.bool()  # [B, T]
        if loss_agg == "token_mean":
            total += int(mask.sum())
        else:
            total += int(mask.any(dim=-1).sum())
    return float(total)


def aggregate_loss(
    per_token: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg: str,
    denominator: float | None = None,
    norm_length: float | None = None,
) -> torch.Tensor:
    """Scalar from per-token values [B, T]: numerator of `loss_agg` / `denominator`.

    - `token_mean`: sum of unmasked values / unmasked tokens.
    - `seq_mean_token_mean`: sum over sequences of (sequence's token mean) / sequences.
    - `seq_mean_token_sum_norm`: sum over sequences of (sequence's token sum / norm_length)
      / sequences (Dr. GRPO: no per-length normalisation).
    `denominator` defaults to `loss_denominator(loss_mask, loss_agg)`. An empty mask gives 0.
    """
    mask = loss_mask.bool()  # [B, T]
    if denominator is None:
        denominator = loss_denominator(mask, loss_agg)
    # where(), not a product: values at masked-out positions may be inf or NaN.
    token_sums = torch.where(mask, per_token, 0.0).sum(dim=-1)  # [B]
    if loss_agg == "token_mean":
        numerator = token_sums.sum()
    elif loss_agg == "seq_mean_token_mean":
        tokens_per_seq = mask.sum(dim=-1).clamp(min=1)  # [B]
        numerator = (token_sums / tokens_per_seq).sum()
    elif loss_agg == "seq_mean_token_sum_norm":
        if not (norm_length and norm_length > 0):
            raise ValueError(
                "loss_agg seq_mean_token_sum_norm needs norm_length > 0 (the constant L)"
            )
        numerator = token_sums.sum() / norm_length
    else:
        raise ValueError(f"loss_agg {loss_agg!r} is unknown; options: {LOSS_AGG_MODES}")
    # Counts are whole numbers, so the clamp only turns 0/0 (nothing unmasked) into 0/1 = 0.
    return numerator / max(float(denominator), 1.0)


def masked_mean(values: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Mean of `values` [B, T] over unmasked positions; 0 when there are none."""
    mask = loss_mask.bool()  # [B, T]
    return torch.where(mask, values, 0.0).sum() / mask.sum().clamp(min=1)


def masked_std(values: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Population std of `values` [B, T] over unmasked positions; 0 when there are none."""
    mask = loss_mask.bool()  # [B, T]
    centred = torch.where(mask, values - masked_mean(values, mask), 0.0)  # [B, T]
    return (centred.square().sum() / mask.sum().clamp(min=1)).sqrt()


# ---------------------------------------------------------------------------------------------
# Per-token terms, each [B, T]
# ---------------------------------------------------------------------------------------------


class PolicyTerms(NamedTuple):
    loss: torch.Tensor
    """[B, T] per-token surrogate loss, 0 at masked-out positions."""
    ratio: torch.Tensor
    """[B, T] exp(policy - old), 1 at masked-out positions."""
    clipped_low: torch.Tensor
    """[B, T] bool: A < 0 and ratio < 1 - clip_low (the clip is active, no gradient)."""
    clipped_high: torch.Tensor
    """[B, T] bool: A > 0 and ratio > 1 + clip_high."""
    dual_clipped: torch.Tensor
    """[B, T] bool: A < 0 and ratio > dual_clip (the loss is bounded by -c * A)."""


def ppo_token_loss(
    policy_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None = None,
) -> PolicyTerms:
    """PPO clipped surrogate per token: max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high)),
    then, with dual-clip c, min(that, -c A) for A < 0. r = exp(policy - old); old is detached."""
    mask = loss_mask.bool()  # [B, T]
    # where() before exp(): padding may hold anything, and a subtraction passes zero grad safely.
    log_ratio = torch.where(mask, policy_logprobs - old_logprobs.detach(), 0.0)  # [B, T]
    ratio = torch.exp(log_ratio.clamp(max=_MAX_LOG_RATIO))  # [B, T]
    advantages = advantages.detach()
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    dual_clipped = torch.zeros_like(mask)
    if dual_clip is not None:
        # For A < 0 the surrogate grows without bound in r; cap it at -c*A (c > 1).
        dual_clipped = mask & (advantages < 0) & (ratio > dual_clip)
        loss = torch.where(advantages < 0, torch.minimum(loss, -dual_clip * advantages), loss)
    with torch.no_grad():
        clipped_low = mask & (advantages < 0) & (ratio < 1.0 - clip_low)
        clipped_high = mask & (advantages > 0) & (ratio > 1.0 + clip_high)
    return PolicyTerms(
        loss=torch.where(mask, loss, 0.0),
        ratio=ratio,
        clipped_low=clipped_low,
        clipped_high=clipped_high,
        dual_clipped=dual_clipped.detach(),
    )


def kl_per_token(
    policy_logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    estimator: str = "k3",
    loss_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token estimate [B, T] of KL(policy || reference) on tokens sampled from the policy.

    With log_r = ref - policy (reference detached):
    k1 = -log_r (unbiased); k2 = log_r^2 / 2 (biased); k3 = exp(log_r) - 1 - log_r (unbiased and
    >= 0). Their gradients are another matter: in expectation over sampled tokens, grad k3 is
    grad KL(ref || policy), grad k2 is grad KL(policy || ref) and grad k1 is 0 (which is why
    `kl: loss` refuses k1). Positions where loss_mask is 0 are 0.
    """
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"kl_estimator {estimator!r} is unknown; options: {KL_ESTIMATORS}")
    log_r = ref_logprobs.detach() - policy_logprobs  # [B, T]
    if loss_mask is not None:
        log_r = torch.where(loss_mask.bool(), log_r, 0.0)
    if estimator == "k1":
        kl = -log_r
    elif estimator == "k2":
        kl = 0.5 * log_r.square()
    else:
        log_r = log_r.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
        kl = torch.exp(log_r) - 1.0 - log_r
    return kl


def kl_reward_penalty(
    old_logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    loss_mask: torch.Tensor,
    kl_coef: float,
    estimator: str = "k1",
) -> torch.Tensor:
    """`kl: reward`: the per-token penalty [B, T] kl_coef * KL(old || ref), detached and 0 off
    the mask. The trainer subtracts it from the token rewards before computing advantages; the
    loss then has no KL term (`LossSettings.kl_in_loss` is False)."""
    with torch.no_grad():
        return kl_coef * kl_per_token(old_logprobs, ref_logprobs, estimator, loss_mask)  # [B, T]


def value_token_loss(
    values: torch.Tensor,
    returns: torch.Tensor,
    old_values: torch.Tensor | None = None,
    value_clip: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token value loss [B, T] and where the clipped branch was taken [B, T] (bool):
    0.5 * max((V - R)^2, (clip(V, V_old - eps, V_old + eps) - R)^2), or 0.5 * (V - R)^2
    without value_clip."""
    returns = returns.detach()
    unclipped = (values - returns).square()
    if value_clip is None:
        return 0.5 * unclipped, torch.zeros_like(values, dtype=torch.bool)
    if old_values is None:
        raise ValueError("value_clip needs old_values")
    old_values = old_values.detach()
    values_clipped = old_values + (values - old_values).clamp(-value_clip, value_clip)  # [B, T]
    clipped = (values_clipped - returns).square()
    return 0.5 * torch.maximum(unclipped, clipped), (clipped > unclipped).detach()


# ---------------------------------------------------------------------------------------------
# The combined loss
# ---------------------------------------------------------------------------------------------


def _check_shapes(inputs: LossInputs) -> None:
    shape = inputs.loss_mask.shape
    if len(shape) != 2:
        raise ValueError(f"loss_mask must be [B, T], got {tuple(shape)}")
    for name in ("policy_logprobs", "old_logprobs", "ref_logprobs", "entropy", "values",
                 "old_values", "returns", "is_weights"):
        tensor = getattr(inputs, name)
        if tensor is not None and tensor.shape != shape:
            raise ValueError(f"{name} has shape {tuple(tensor.shape)}, loss_mask {tuple(shape)}")
    if inputs.advantages.shape not in (shape, shape[:1]):
        raise ValueError(f"advantages must be [B, T] or [B], got {tuple(inputs.advantages.shape)}")


def compute_policy_loss(
    inputs: LossInputs,
    settings: LossSettings,
    denominator: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The scalar loss of one (micro-)batch and its detached metrics.

    loss = policy + kl_coef * kl (when `settings.kl_in_loss`) + value_coef * value (when `values`
    is given) - entropy_coef * entropy (when `entropy` is given), each term aggregated by
    `settings.loss_agg` over `denominator` (default: this batch's own, see `loss_denominator`).
    With `is_weights`, the policy and KL terms are weighted per token before aggregation.

    Metrics: `policy_loss`, `kl_loss`, `value_loss`, `entropy_loss` are the aggregated terms (with
    a minibatch denominator they sum over micro-batches). `ratio_mean`, `ratio_std`,
    `clip_frac_low`, `clip_frac_high`, `dual_clip_frac`, `approx_kl_old` (k3 estimate of
    KL(old || policy) from tokens sampled by old: r - 1 - log r), `kl_ref`, `entropy`,
    `value_clip_frac` are means over this call's unmasked tokens, and `num_tokens` is their count
    (to weight them across micro-batches). An empty mask gives 0s.
    """
    _check_shapes(inputs)
    mask = inputs.loss_mask.bool()  # [B, T]
    if denominator is None:
        denominator = loss_denominator(mask, settings.loss_agg)

    def aggregate(per_token: torch.Tensor) -> torch.Tensor:
        return aggregate_loss(per_token, mask, settings.loss_agg, denominator, settings.norm_length)

    advantages = inputs.advantages
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1).expand_as(inputs.policy_logprobs)  # [B] -> [B, T]
    policy = ppo_token_loss(
        inputs.policy_logprobs,
        inputs.old_logprobs,
        advantages,
        mask,
        settings.clip_low,
        settings.clip_high,
        settings.dual_clip,
    )
    weights = inputs.is_weights.detach() if inputs.is_weights is not None else None

    def weighted(per_token: torch.Tensor) -> torch.Tensor:
        return per_token if weights is None else per_token * weights

    policy_loss = aggregate(weighted(policy.loss))
    loss = policy_loss

    def token_mean(values: torch.Tensor) -> torch.Tensor:
        return masked_mean(values.detach().float(), mask)

    # Tokens were sampled by old: log_r = policy - old, i.e. KL(old || policy) = E_old[r - 1 - log r].
    approx_kl_old = kl_per_token(inputs.old_logprobs, inputs.policy_logprobs.detach(), "k3", mask)
    metrics: dict[str, torch.Tensor] = {
        "policy_loss": policy_loss.detach(),
        "ratio_mean": token_mean(policy.ratio),
        "ratio_std": masked_std(policy.ratio.detach().float(), mask),
        "clip_frac_low": token_mean(policy.clipped_low),
        "clip_frac_high": token_mean(policy.clipped_high),
        "dual_clip_frac": token_mean(policy.dual_clipped),
        "approx_kl_old": token_mean(approx_kl_old),
        "num_tokens": mask.sum().detach().float(),
    }

    if inputs.ref_logprobs is not None:
        kl = kl_per_token(inputs.policy_logprobs, inputs.ref_logprobs, settings.kl_estimator, mask)
        metrics["kl_ref"] = token_mean(kl)
        if settings.kl_in_loss:
            kl_loss = aggregate(weighted(kl))
            loss = loss + settings.kl_coef * kl_loss
            metrics["kl_loss"] = kl_loss.detach()
    elif settings.kl_in_loss:
        raise ValueError("kl='loss' needs ref_logprobs")

    if inputs.values is not None:
        if inputs.returns is None:
            raise ValueError("the value loss needs returns")

        def on_mask(tensor: torch.Tensor | None) -> torch.Tensor | None:
            # Zero the padding before squaring: NaN there would turn its zero grad into NaN.
            return None if tensor is None else torch.where(mask, tensor, 0.0)

        value_loss_tokens, value_clipped = value_token_loss(
            on_mask(inputs.values),
            on_mask(inputs.returns),
            on_mask(inputs.old_values),
            settings.value_clip,
        )
        value_loss = aggregate(value_loss_tokens)
        loss = loss + settings.value_coef * value_loss
        metrics["value_loss"] = value_loss.detach()
        metrics["value_clip_frac"] = token_mean(value_clipped)

    if inputs.entropy is not None:
        entropy_loss = aggregate(inputs.entropy)
        loss = loss - settings.entropy_coef * entropy_loss
        metrics["entropy"] = token_mean(inputs.entropy)
        metrics["entropy_loss"] = entropy_loss.detach()
    elif settings.entropy_coef > 0:
        raise ValueError("entropy_coef > 0 needs entropy")

    metrics["loss"] = loss.detach()
    return loss, metrics
