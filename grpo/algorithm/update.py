"""One policy update from collected trajectories: `train_step(policy, reference, ...) -> stats`.

Advantages → `old_logprobs` / `ref_logprobs` / old values (a no-grad pass, only when needed) →
`ppo_epochs` × minibatches of length-sorted micro-batches with gradient accumulation → grad-norm
clip → optimizer and scheduler step. Separate from the trainer's setup and loop so it can be
tested alone on a tiny model.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import dataclass

import torch

from grpo.algorithm.advantages import gae, outcome_advantages, token_rewards_from_outcome
from grpo.algorithm.loss import (
    LossInputs,
    LossSettings,
    compute_policy_loss,
    kl_reward_penalty,
    loss_denominator,
)


class NonFiniteLossError(RuntimeError):
    """The loss or gradient norm was NaN/inf; the update was skipped."""


class LogprobMismatchError(RuntimeError):
    """The trainer's log-probs of the sampled tokens disagree with the rollout engine's."""


@dataclass(frozen=True)
class UpdateSettings:
    loss: LossSettings
    advantage: str = "grpo"
    normalize_std: bool = True
    gamma: float = 0.99
    lam: float = 0.95
    ppo_epochs: int = 1
    num_minibatches: int = 1
    micro_batch_size: int = 8
    max_grad_norm: float = 1.0
    temperature: float = 1.0
    """The rollout temperature: log-probs are of softmax(logits / temperature), as sampled."""
    logprob_tolerance: float = 0.05
    pad_token_id: int = 0
    skip_zero_advantage: bool = True

    @property
    def uses_values(self) -> bool:
        return self.advantage == "gae"

    @classmethod
    def from_config(cls, cfg, pad_token_id: int = 0) -> UpdateSettings:
        algo = cfg.algorithm
        return cls(
            # Dr. GRPO's constant L: the most tokens an episode may hold.
            loss=LossSettings.from_config(algo, norm_length=float(cfg.rollout.max_total_tokens)),
            advantage=algo.advantage,
            normalize_std=algo.normalize_std,
            gamma=algo.gamma,
            lam=algo.lam,
            ppo_epochs=algo.ppo_epochs,
            num_minibatches=algo.num_minibatches,
            micro_batch_size=algo.micro_batch_size,
            max_grad_norm=algo.max_grad_norm,
            temperature=cfg.rollout.temperature if cfg.rollout.temperature > 0 else 1.0,
            logprob_tolerance=algo.logprob_tolerance,
            pad_token_id=pad_token_id,
            skip_zero_advantage=algo.skip_zero_advantage,
        )


def make_optimizer(policy, algo) -> torch.optim.Optimizer:
    params = [p for p in policy.trainable_parameters() if p.requires_grad]
    if not params:
        raise ValueError("the policy has no trainable parameters")
    # The fused kernel updates every tensor in one pass: 0.10 s instead of 0.37 s per step for
    # SmolLM2-135M's 135M fp32 parameters on 2 CPU threads (the default per-tensor loop).
    fused = all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in params)
    return torch.optim.AdamW(params, lr=algo.learning_rate, weight_decay=algo.weight_decay, fused=fused)


def make_scheduler(optimizer, algo) -> torch.optim.lr_scheduler.LambdaLR:
    warmup = algo.warmup_steps
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup else 1.0
    )


# ------------------------------------------------------------------------------ batching
@dataclass
class _MicroBatch:
    index: torch.Tensor  # [b] rows of the step's trajectory list
    input_ids: torch.Tensor  # [b, L]
    attention_mask: torch.Tensor  # [b, L]
    loss_mask: torch.Tensor  # [b, L-1] aligned to targets input_ids[:, 1:]
    behavior_logprobs: torch.Tensor  # [b, L-1]


def _collate(trajectories, rows: list[int], pad_id: int, device) -> _MicroBatch:
    length = max(len(trajectories[i].token_ids) for i in rows)
    b = len(rows)
    input_ids = torch.full((b, length), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((b, length), dtype=torch.long)
    loss_mask = torch.zeros((b, length - 1), dtype=torch.bool)
    behavior = torch.zeros((b, length - 1), dtype=torch.float32)
    for r, i in enumerate(rows):
        t = trajectories[i]
        n = len(t.token_ids)
        input_ids[r, :n] = torch.tensor(t.token_ids)
        attention_mask[r, :n] = 1
        # Target position j scores token j + 1: shift the per-token lists left by one.
        loss_mask[r, : n - 1] = torch.tensor(t.loss_mask[1:], dtype=torch.bool)
        behavior[r, : n - 1] = torch.tensor(t.behavior_logprobs[1:])
    return _MicroBatch(torch.tensor(rows), input_ids.to(device), attention_mask.to(device),
                       loss_mask.to(device), behavior.to(device))


def _micro_batches(trajectories, rows: list[int], size: int, pad_id: int, device) -> list[_MicroBatch]:
    # Sorting by length keeps padding (wasted compute) small inside each micro-batch.
    rows = sorted(rows, key=lambda i: len(trajectories[i].token_ids))
    return [_collate(trajectories, rows[s : s + size], pad_id, device) for s in range(0, len(rows), size)]


def _scatter(per_row: dict[int, torch.Tensor], mb: _MicroBatch) -> torch.Tensor:
    width = mb.loss_mask.shape[1]
    out = torch.zeros(mb.loss_mask.shape, device=mb.loss_mask.device)  # [b, L-1]
    for r, i in enumerate(mb.index.tolist()):
        row = per_row[i][:width]
        out[r, : row.shape[0]] = row
    return out


# ------------------------------------------------------------------------------ the step
@torch.no_grad()
def _no_grad_pass(policy, reference, trajectories, rows, settings, device, *, want_old: bool,
                  want_values: bool, want_ref: bool, seconds: dict[str, float]):
    """Old log-probs (and values) under the policy and/or ref log-probs under the reference of
    trajectories `rows`, as 1-D tensors over target positions (0 off the loss mask). Adds the
    time of each kind of pass to `seconds`."""
    old, values, ref = {}, {}, {}
    for mb in _micro_batches(trajectories, rows, settings.micro_batch_size, settings.pad_token_id, device):
        start = time.perf_counter()
        out = None
        if want_old or want_values:
            out = policy(mb.input_ids, mb.attention_mask, temperature=settings.temperature,
                         with_values=want_values, positions=mb.loss_mask)
        mid = time.perf_counter()
        ref_lp = (
            reference.ref_logprobs(mb.input_ids, mb.attention_mask, temperature=settings.temperature,
                                   positions=mb.loss_mask)
            if want_ref
            else None
        )
        seconds["old_logprobs_s"] += mid - start
        seconds["reference_s"] += time.perf_counter() - mid
        for r, i in enumerate(mb.index.tolist()):
            n = len(trajectories[i].token_ids) - 1
            if out is not None:
                old[i] = out.logprobs[r, :n].float()
            if want_values:
                values[i] = out.values[r, :n].float()
            if want_ref:
                ref[i] = ref_lp[r, :n].float()
    return old, values, ref


def _mismatch_stats(diffs: list[torch.Tensor]) -> dict[str, float]:
    """Distribution of |trainer − engine| log-prob over the sampled tokens: mean, p50, p99, max."""
    flat = torch.cat([d.detach().float().cpu() for d in diffs]) if diffs else torch.zeros(0)
    if flat.numel() == 0:
        return {}
    return {
        "train/logprob_mismatch": float(flat.mean()),
        "train/logprob_mismatch_p50": float(flat.median()),
        "train/logprob_mismatch_p99": float(torch.quantile(flat, 0.99)) if flat.numel() > 1 else float(flat[0]),
        "train/logprob_mismatch_max": float(flat.max()),
    }


def _sampled_diffs(trajectories, trainer_logprobs: list[torch.Tensor]) -> list[torch.Tensor]:
    """|trainer − engine| log-prob of each trajectory's sampled tokens."""
    diffs = []
    for t, trainer_lp in zip(trajectories, trainer_logprobs):
        mask = torch.tensor(t.loss_mask[1:], dtype=torch.bool)
        behavior = torch.tensor(t.behavior_logprobs[1:])
        diffs.append((trainer_lp.cpu() - behavior)[mask].abs())
    return diffs


def _kl_penalty(trajectories, i: int, settings, old, ref) -> torch.Tensor:
    """`kl_in_reward`: kl_coef * KL(old || ref) per target position of trajectory i, 0 off the mask."""
    mask = torch.tensor(trajectories[i].loss_mask[1:], dtype=torch.bool).unsqueeze(0)  # [1, n]
    return kl_reward_penalty(old[i].cpu().unsqueeze(0), ref[i].cpu().unsqueeze(0), mask,
                             settings.loss.kl_coef, settings.loss.kl_estimator)[0]  # [n]


def _advantages(trajectories, settings, old, values, ref):
    """Per-trajectory token advantages (and returns for the value loss) over target positions."""
    groups: dict[str, list[int]] = defaultdict(list)
    for i, t in enumerate(trajectories):
        groups[t.group_id].append(i)
    kl_in_reward = settings.loss.kl_in_reward and settings.loss.kl_coef > 0 and bool(ref)
    advantages: dict[int, torch.Tensor] = {}
    returns: dict[int, torch.Tensor] = {}
    if settings.advantage != "gae":
        sizes = {len(m) for m in groups.values()}
        if len(sizes) != 1:
            raise ValueError(f"groups must be whole and of one size, got sizes {sorted(sizes)}")
        members = list(groups.values())

        def reward(i: int) -> float:
            # An outcome advantage has one number per episode: the episode's summed KL penalty.
            penalty = float(_kl_penalty(trajectories, i, settings, old, ref).sum()) if kl_in_reward else 0.0
            return trajectories[i].reward - penalty

        rewards = torch.tensor([[reward(i) for i in m] for m in members])  # [num_groups, G]
        adv = outcome_advantages(rewards, settings.advantage, normalize_std=settings.normalize_std)
        for g, m in enumerate(members):
            for j, i in enumerate(m):
                mask = torch.tensor(trajectories[i].loss_mask[1:], dtype=torch.float32)
                advantages[i] = adv[g, j] * mask  # [n]
        return advantages, returns
    for i, t in enumerate(trajectories):
        mask = torch.tensor(t.loss_mask[1:], dtype=torch.float32).unsqueeze(0)  # [1, n]
        # Per-turn rewards sit on a token index of token_ids; target positions are shifted by one.
        turn_rewards = [(idx - 1, r) for idx, r in t.turn_rewards]
        outcome = t.reward - sum(r for _, r in t.turn_rewards)
        rewards = token_rewards_from_outcome(torch.tensor([outcome]), mask, [turn_rewards])  # [1, n]
        if kl_in_reward:
            rewards = rewards - _kl_penalty(trajectories, i, settings, old, ref).unsqueeze(0)
        adv, ret = gae(rewards, values[i].unsqueeze(0).cpu(), mask, settings.gamma, settings.lam)
        advantages[i], returns[i] = adv[0], ret[0]
    return advantages, returns


def _skippable(settings: UpdateSettings) -> bool:
    """Whether a zero-advantage sequence has no gradient but (at most) the KL term."""
    return (settings.skip_zero_advantage and settings.advantage != "gae"
            and not settings.loss.kl_in_reward and settings.loss.entropy_coef == 0)


def train_step(policy, reference, optimizer, scheduler, trajectories, settings: UpdateSettings,
               *, check_logprobs: bool = False) -> dict[str, float]:
    """Update the policy on whole groups of trajectories. Returns flat `train/…` metrics."""
    device = next(policy.parameters()).device
    want_ref = reference is not None and settings.loss.kl_coef > 0
    rows = list(range(len(trajectories)))
    skippable = _skippable(settings)
    active = rows
    if skippable:  # outcome advantages need only rewards: compute them first, then skip zeros
        advantages, returns = _advantages(trajectories, settings, {}, {}, {})
        active = [i for i in rows if bool(advantages[i].any())]
    # A no-grad policy pass (old log-probs) is needed when the policy moves before a minibatch is
    # seen (several minibatches or epochs), for GAE values, or for the step-0 check. Otherwise
    # old_logprobs are exactly the first forward's log-probs, detached (ratio = 1). The reference
    # pass runs whenever a KL term needs it.
    multi_pass = settings.ppo_epochs > 1 or settings.num_minibatches > 1
    kl_in_reward = want_ref and settings.loss.kl_in_reward  # the penalty is KL(old || ref)
    need_old = multi_pass or settings.uses_values or check_logprobs or kl_in_reward
    need_pass = need_old or want_ref
    old, values, ref = ({}, {}, {})
    seconds: dict[str, float] = defaultdict(float)
    stats: dict[str, float] = {"train/skipped_sequences": (len(rows) - len(active)) / max(len(rows), 1)}
    pass_rows = rows if check_logprobs or not skippable else active
    if need_pass and pass_rows:
        policy.eval()
        old, values, ref = _no_grad_pass(policy, reference, trajectories, pass_rows, settings, device,
                                         want_old=need_old, want_values=settings.uses_values,
                                         want_ref=want_ref, seconds=seconds)
    if need_old and pass_rows:
        stats.update(_mismatch_stats(_sampled_diffs([trajectories[i] for i in pass_rows],
                                                    [old[i] for i in pass_rows])))
        mean_diff, max_diff = stats.get("train/logprob_mismatch", 0.0), stats.get("train/logprob_mismatch_max", 0.0)
        if check_logprobs and mean_diff > settings.logprob_tolerance:
            raise LogprobMismatchError(
                f"step-0 check failed: mean |trainer - engine| log-prob of the sampled tokens is "
                f"{mean_diff:.4f} (max {max_diff:.4f}), above algorithm.logprob_tolerance="
                f"{settings.logprob_tolerance}. The trainer does not score what the engine sampled: "
                "check that both use the same weights, temperature and dtype, and that token ids "
                "were not re-tokenized. Training on these ratios would corrupt every update."
            )
    if not skippable:
        advantages, returns = _advantages(trajectories, settings, old, values, ref)
    policy.train()
    totals: dict[str, float] = defaultdict(float)
    token_weighted: dict[str, float] = defaultdict(float)
    tokens_seen = 0.0
    grad_norms = []
    mismatch: list[torch.Tensor] = []  # |old − behavior| per micro-batch when old = this forward
    active_set = set(active)
    generator = torch.Generator().manual_seed(int(torch.initial_seed()) % (2**31) + len(trajectories))
    for _epoch in range(settings.ppo_epochs):
        order = torch.randperm(len(rows), generator=generator).tolist() if multi_pass else rows
        for part in range(settings.num_minibatches):
            mb_rows = order[part :: settings.num_minibatches]
            # The denominator counts every sequence of the minibatch, skipped ones too: skipping
            # a zero-advantage sequence must not rescale the others' gradient.
            denominator = loss_denominator(
                [torch.tensor(trajectories[i].loss_mask[1:], dtype=torch.bool).unsqueeze(0) for i in mb_rows],
                settings.loss.loss_agg)
            mb_rows = [i for i in mb_rows if i in active_set]
            if not mb_rows:
                continue
            micro = _micro_batches(trajectories, mb_rows, settings.micro_batch_size,
                                   settings.pad_token_id, device)
            start = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            for mb in micro:
                out = policy(mb.input_ids, mb.attention_mask, temperature=settings.temperature,
                             with_entropy=True, with_values=settings.uses_values, positions=mb.loss_mask)
                policy_lp = out.logprobs.float()  # [b, L-1]
                if need_old:
                    old_lp = _scatter(old, mb)
                else:
                    old_lp = policy_lp.detach()
                    mismatch.append((old_lp - mb.behavior_logprobs).abs()[mb.loss_mask])
                inputs = LossInputs(
                    policy_logprobs=policy_lp,
                    old_logprobs=old_lp,
                    advantages=_scatter(advantages, mb),
                    loss_mask=mb.loss_mask,
                    ref_logprobs=_scatter(ref, mb) if want_ref else None,
                    entropy=out.entropy.float() if settings.loss.entropy_coef > 0 else None,
                    values=out.values.float() if settings.uses_values else None,
                    old_values=_scatter(values, mb) if settings.uses_values else None,
                    returns=_scatter(returns, mb) if settings.uses_values else None,
                )
                loss, metrics = compute_policy_loss(inputs, settings.loss, denominator)
                if not torch.isfinite(loss):
                    optimizer.zero_grad(set_to_none=True)
                    raise NonFiniteLossError(f"non-finite loss {float(loss.detach())}")
                loss.backward()
                n = float(metrics["num_tokens"])
                tokens_seen += n
                for key, value in metrics.items():
                    if key.endswith("_loss") or key == "loss":
                        totals[key] += float(value)
                    elif key != "num_tokens":
                        token_weighted[key] += float(value) * n
                if out.entropy is not None and "entropy" not in metrics:
                    ent = out.entropy.detach().float()[mb.loss_mask]
                    token_weighted["entropy"] += float(ent.sum())
            grad_norm = torch.nn.utils.clip_grad_norm_(
                [p for p in policy.trainable_parameters() if p.grad is not None], settings.max_grad_norm)
            if not math.isfinite(float(grad_norm)):
                optimizer.zero_grad(set_to_none=True)
                raise NonFiniteLossError(f"non-finite gradient norm {float(grad_norm)}")
            grad_norms.append(float(grad_norm))
            seconds["forward_backward_s"] += time.perf_counter() - start
            start = time.perf_counter()
            optimizer.step()
            scheduler.step()
            seconds["optimizer_s"] += time.perf_counter() - start
    steps = max(len(grad_norms), 1)
    for key, value in totals.items():
        stats[f"train/{key}"] = value / steps
    for key, value in token_weighted.items():
        stats[f"train/{key}"] = value / max(tokens_seen, 1.0)
    stats.update(_mismatch_stats(mismatch))
    stats["train/clip_frac"] = stats.get("train/clip_frac_low", 0.0) + stats.get("train/clip_frac_high", 0.0)
    stats["train/grad_norm"] = sum(grad_norms) / len(grad_norms) if grad_norms else 0.0
    stats["train/optimizer_steps"] = float(len(grad_norms))
    rewards = torch.tensor([t.reward for t in trajectories])
    stats["train/reward_mean"] = float(rewards.mean())
    stats["train/reward_std"] = float(rewards.std()) if len(rewards) > 1 else 0.0
    stats["train/zero_variance_groups"] = _zero_variance_fraction(trajectories)
    stats["train/num_sequences"] = float(len(trajectories))
    stats["train/num_tokens"] = tokens_seen / settings.ppo_epochs
    stats.update({f"time/{key}": value for key, value in seconds.items()})
    return stats


def _zero_variance_fraction(trajectories) -> float:
    groups: dict[str, list[float]] = defaultdict(list)
    for t in trajectories:
        groups[t.group_id].append(t.reward)
    flat = [max(r) - min(r) == 0 for r in groups.values()]
    return sum(flat) / len(flat) if flat else 0.0
