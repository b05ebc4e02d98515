"""Behaviour correction: importance weights for the gap between the sampler and the trainer.

The rollout engine that sampled a token (the behaviour policy, `behavior_logprobs`) is never
exactly the policy the trainer scores before the update (`old_logprobs`): a bf16 engine, vLLM's
kernels, batch-shape-dependent matmuls. The PPO ratio pi / pi_old only corrects for the trainer's
own updates, so without a weight the update treats the engine's samples as samples of pi_old.
Per sampled token, with rho = pi_old / pi_behavior = exp(old - behavior):

- `tis` (truncated importance sampling): weight min(rho, C);
- `mis` (masked importance sampling): weight rho where rho <= C, 0 where it is above;
- both: every token of a sequence whose mean per-token mismatch KL exceeds `max_sequence_kl`
  gets weight 0 (the sequence is rejected);
- `off`: no weights; the engine's log-probs then reach only metrics and the step-0 check.

The mismatch KL per token is k3 = rho - 1 - log rho: a non-negative, unbiased estimate of
KL(pi_behavior || pi_old) from tokens sampled by the engine.

The weights are detached and multiply the per-token policy and KL terms of the loss
(grpo/algorithm/loss.py); the loss denominator does not change, so a masked or rejected token
still counts as a sample of the mean (the estimate stays E_behavior[w * term] / N).
Nothing here calls a model, reads a config object or logs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import torch

if TYPE_CHECKING:
    from grpo.algorithm.config import BehaviorCorrectionConfig

CORRECTION_MODES: tuple[str, ...] = ("off", "tis", "mis")

# exp() of a log-ratio beyond this is a broken sampler, not a weight: clamp before exp so that a
# token the trainer finds 1e-30 times likelier cannot overflow (its weight is clipped anyway).
_MAX_LOG_RATIO = 20.0


@dataclass(frozen=True)
class CorrectionSettings:
    """The behaviour-correction options as plain values (see BehaviorCorrectionConfig, which
    checks them; `from_config` builds these from it)."""

    mode: str = "tis"
    clip: float = 2.0
    max_sequence_kl: float | None = 0.05

    @property
    def enabled(self) -> bool:
        return self.mode != "off"

    @classmethod
    def from_config(cls, config: BehaviorCorrectionConfig) -> CorrectionSettings:
        return cls(mode=config.mode, clip=config.clip, max_sequence_kl=config.max_sequence_kl)


class BehaviorWeights(NamedTuple):
    weights: torch.Tensor | None
    """[B, T] detached weight of each token's policy and KL terms (0 off the mask); None: `off`."""
    mismatch_kl: torch.Tensor
    """[B, T] k3 estimate of KL(behavior || old) per token, 0 off the mask."""
    clipped: torch.Tensor
    """[B, T] bool: sampled tokens with rho > clip (truncated by `tis`, masked by `mis`)."""
    rejected: torch.Tensor
    """[B] bool: sequences whose mean mismatch KL exceeds max_sequence_kl."""


@torch.no_grad()
def behavior_weights(
    old_logprobs: torch.Tensor,
    behavior_logprobs: torch.Tensor,
    loss_mask: torch.Tensor,
    settings: CorrectionSettings,
) -> BehaviorWeights:
    """Importance weights [B, T] of sampled tokens from pi_old [B, T] and pi_behavior [B, T]
    log-probs (module docstring). Rows hold whole sequences: the rejection reads a row's mean."""
    mask = loss_mask.bool()  # [B, T]
    # where() first: padding may hold anything.
    log_rho = torch.where(mask, old_logprobs.float() - behavior_logprobs.float(), 0.0)  # [B, T]
    log_rho = log_rho.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    rho = torch.exp(log_rho)  # [B, T], 1 off the mask
    mismatch_kl = torch.where(mask, rho - 1.0 - log_rho, 0.0)  # [B, T]
    clipped = mask & (rho > settings.clip)  # [B, T]
    tokens = mask.sum(dim=-1)  # [B]
    sequence_kl = mismatch_kl.sum(dim=-1) / tokens.clamp(min=1)  # [B]
    rejected = torch.zeros_like(tokens, dtype=torch.bool)  # [B]
    if settings.max_sequence_kl is not None:
        rejected = (tokens > 0) & (sequence_kl > settings.max_sequence_kl)
    if not settings.enabled:
        return BehaviorWeights(None, mismatch_kl, clipped, torch.zeros_like(rejected))
    if settings.mode == "tis":
        weights = rho.clamp(max=settings.clip)
    elif settings.mode == "mis":
        weights = torch.where(clipped, 0.0, rho)
    else:
        raise ValueError(f"behavior_correction {settings.mode!r} is unknown; options: {CORRECTION_MODES}")
    keep = mask & ~rejected.unsqueeze(-1)  # [B, T]
    return BehaviorWeights(torch.where(keep, weights, 0.0), mismatch_kl, clipped, rejected)


def correction_stats(records: Sequence[BehaviorWeights], masks: Sequence[torch.Tensor]) -> dict[str, float]:
    """The step's behaviour-correction metrics from each micro-batch's weights and loss mask:
    mismatch KL(behavior || old) per sampled token (mean, p99); with a correction on, the mean
    weight, the fraction of tokens with rho > clip and the fraction of sequences rejected."""
    if not records:
        return {}
    flat_masks = [m.bool().cpu() for m in masks]
    kl = torch.cat([r.mismatch_kl.float().cpu()[m] for r, m in zip(records, flat_masks, strict=True)])
    if kl.numel() == 0:
        return {}
    out = {
        "train/mismatch_kl": float(kl.mean()),
        "train/mismatch_kl_p99": float(torch.quantile(kl, 0.99)) if kl.numel() > 1 else float(kl[0]),
    }
    if records[0].weights is None:
        return out
    weights = torch.cat([r.weights.float().cpu()[m] for r, m in zip(records, flat_masks, strict=True)])
    clipped = torch.cat([r.clipped.cpu()[m] for r, m in zip(records, flat_masks, strict=True)])
    # Sequences with nothing sampled are not samples of the fraction.
    rejected = torch.cat([r.rejected.cpu()[m.any(dim=-1)] for r, m in zip(records, flat_masks, strict=True)])
    out.update({
        "train/is_weight_mean": float(weights.mean()),
        "train/is_clip_frac": float(clipped.float().mean()),
        "train/is_rejected_frac": float(rejected.float().mean()) if rejected.numel() else 0.0,
    })
    return out
