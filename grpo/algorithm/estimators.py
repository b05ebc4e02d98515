"""Advantage estimators by name, and the advantages of a step's trajectories.

`ESTIMATORS` holds one entry per estimator: its function, whether its advantages are per token
(else one per episode, broadcast over the episode's sampled tokens) and whether it needs the value
head. Adding an estimator is one function in grpo/algorithm/advantages.py and one line here.

`trajectory_advantages(...)` turns a step's trajectories (whole groups) into per-row token
advantages and value targets; `kl_penalty` is the `kl: reward` penalty it subtracts;
`rows_to_train` leaves out the rows whose update would be exactly zero; `zero_variance_fraction`
reports how many groups carried no signal.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from grpo.algorithm.advantages import (
    dr_grpo_advantages,
    gae,
    grpo_advantages,
    rloo_advantages,
    token_rewards_from_outcome,
    whiten_advantages,
)
from grpo.algorithm.config import GAEConfig, OutcomeAdvantageConfig, TurnAdvantageConfig
from grpo.algorithm.loss import LossSettings, kl_reward_penalty
from grpo.algorithm.turn_advantages import unit_advantages
from grpo.trajectory import Trajectory


@dataclass(frozen=True)
class Estimator:
    compute: Callable
    """Outcome estimators: `(rewards [N, G], config) -> advantages [N, G]`. Token-level ones:
    `(token_rewards [1, T], values [1, T], loss_mask [1, T], config) -> (advantages, returns)`."""
    token_level: bool
    needs_values: bool
    per_turn: bool = False
    """An outcome estimator whose turns' tokens also get their credit units' advantage
    (grpo/algorithm/turn_advantages.py)."""


ESTIMATORS: dict[str, Estimator] = {
    "grpo": Estimator(lambda r, cfg: grpo_advantages(r, cfg.normalize_std), False, False),
    "dr_grpo": Estimator(lambda r, cfg: dr_grpo_advantages(r), False, False),
    "rloo": Estimator(lambda r, cfg: rloo_advantages(r), False, False),
    "turn_grpo": Estimator(lambda r, cfg: grpo_advantages(r, cfg.normalize_std), False, False, per_turn=True),
    "gae": Estimator(lambda rw, v, m, cfg: gae(rw, v, m, cfg.gamma, cfg.lam, value_lam=cfg.value_lam),
                     True, True),
}

AdvantageConfig = OutcomeAdvantageConfig | TurnAdvantageConfig | GAEConfig


def estimator_of(config: AdvantageConfig) -> Estimator:
    return ESTIMATORS[config.estimator]


def target_mask(trajectory: Trajectory) -> torch.Tensor:
    """[n] bool loss mask over target positions (token j + 1 is scored at position j)."""
    return torch.tensor(trajectory.loss_mask[1:], dtype=torch.bool)


def kl_penalty(trajectory: Trajectory, old: torch.Tensor, ref: torch.Tensor, loss: LossSettings) -> torch.Tensor:
    """`kl: reward`: kl_coef * KL(old || ref) per target position [n], 0 off the mask."""
    mask = target_mask(trajectory).unsqueeze(0)  # [1, n]
    return kl_reward_penalty(old.cpu().unsqueeze(0), ref.cpu().unsqueeze(0), mask,
                             loss.kl_coef, loss.kl_estimator)[0]  # [n]


def _groups(trajectories: Sequence[Trajectory]) -> list[list[int]]:
    groups: dict[str, list[int]] = defaultdict(list)
    for i, t in enumerate(trajectories):
        groups[t.group_id].append(i)
    sizes = {len(m) for m in groups.values()}
    if len(sizes) > 1:
        raise ValueError(f"groups must be whole and of one size, got sizes {sorted(sizes)}")
    return list(groups.values())


def trajectory_advantages(
    trajectories: Sequence[Trajectory],
    config: AdvantageConfig,
    loss: LossSettings,
    *,
    old: dict[int, torch.Tensor] | None = None,
    ref: dict[int, torch.Tensor] | None = None,
    values: dict[int, torch.Tensor] | None = None,
) -> tuple[dict[int, torch.Tensor], dict[int, torch.Tensor]]:
    """Per-row token advantages [n] (0 off the loss mask) and, for token-level estimators, value
    targets [n]. With `kl: reward`, `old` and `ref` give the KL penalty subtracted from rewards."""
    estimator = estimator_of(config)
    penalised = loss.kl == "reward" and bool(ref)

    def penalty(i: int) -> torch.Tensor:
        return kl_penalty(trajectories[i], old[i], ref[i], loss)

    advantages: dict[int, torch.Tensor] = {}
    returns: dict[int, torch.Tensor] = {}
    if not estimator.token_level:
        members = _groups(trajectories)
        # An outcome advantage has one number per episode: the episode's summed KL penalty.
        rewards = torch.tensor([[trajectories[i].reward - (float(penalty(i).sum()) if penalised else 0.0)
                                 for i in m] for m in members])  # [num_groups, G]
        adv = estimator.compute(rewards, config)  # [num_groups, G]
        for g, m in enumerate(members):
            for j, i in enumerate(m):
                advantages[i] = adv[g, j] * target_mask(trajectories[i]).float()  # [n]
            if estimator.per_turn:
                _add_turn_advantages(advantages, [trajectories[i] for i in m], m, config)
        return advantages, returns
    for i, t in enumerate(trajectories):
        mask = target_mask(t).float().unsqueeze(0)  # [1, n]
        # Per-turn rewards sit on a token index of token_ids; target positions are shifted by one.
        turn_rewards = [(idx - 1, r) for idx, r in t.turn_rewards]
        outcome = t.reward - sum(r for _, r in t.turn_rewards)
        rewards = token_rewards_from_outcome(torch.tensor([outcome]), mask, [turn_rewards])  # [1, n]
        if penalised:
            rewards = rewards - penalty(i).unsqueeze(0)
        adv, ret = estimator.compute(rewards, values[i].unsqueeze(0).cpu(), mask, config)
        advantages[i], returns[i] = adv[0], ret[0]
    if isinstance(config, GAEConfig) and config.whiten:
        advantages = _whiten_rows(advantages, trajectories)
    return advantages, returns


def _units_of(group: Sequence[Trajectory]) -> list[list[tuple[str, float]]]:
    """Each episode's credit units as `unit_advantages` reads them: (key, score)."""
    return [[(span.key, span.score) for span in t.credit] for t in group]


def _add_turn_advantages(advantages: dict[int, torch.Tensor], group: Sequence[Trajectory], rows: Sequence[int],
                         config: TurnAdvantageConfig) -> None:
    """Add turn_weight x each turn's mean unit advantage to that turn's tokens, in place."""
    units = unit_advantages(_units_of(group), config.normalize_std)
    for t, row, unit_advs in zip(group, rows, units, strict=True):
        per_turn: dict[tuple[int, int], list[float]] = defaultdict(list)
        for span, value in zip(t.credit, unit_advs, strict=True):
            per_turn[(span.start, span.end)].append(value)
        for (start, end), values in per_turn.items():
            # token_ids index k is scored at target position k - 1
            advantages[row][start - 1:end - 1] += config.turn_weight * sum(values) / len(values)


def _whiten_rows(advantages: dict[int, torch.Tensor], trajectories: Sequence[Trajectory]) -> dict[int, torch.Tensor]:
    """Whitened over every sampled token of the step (rows have different lengths: concatenate)."""
    rows = sorted(advantages)
    flat = torch.cat([advantages[i] for i in rows]).unsqueeze(0)  # [1, sum n]
    mask = torch.cat([target_mask(trajectories[i]) for i in rows]).unsqueeze(0)  # [1, sum n]
    whitened = whiten_advantages(flat, mask)[0]  # [sum n]
    return dict(zip(rows, whitened.split([len(advantages[i]) for i in rows]), strict=True))


def skips_zero_advantage(config: AdvantageConfig, loss: LossSettings, skip: bool) -> bool:
    """Whether a zero-advantage sequence has no gradient at all, so its forward/backward may be
    skipped without changing the update: outcome advantages, no entropy bonus, and the KL off
    (in the loss it still pulls the sequence toward the reference; in the reward its penalty
    makes the advantage non-zero). So one process and data-parallel ranks, which never skip,
    optimise the same objective."""
    return skip and not estimator_of(config).token_level and loss.kl == "off" and loss.entropy_coef == 0


def rows_to_train(trajectories: Sequence[Trajectory], config: AdvantageConfig, loss: LossSettings,
                  skip: bool) -> list[int]:
    """Every row, or — when `skips_zero_advantage` — the rows whose advantage is not exactly 0
    (outcome advantages need only the rewards, so this runs before any model pass)."""
    rows = list(range(len(trajectories)))
    if not skips_zero_advantage(config, loss, skip):
        return rows
    advantages, _ = trajectory_advantages(trajectories, config, loss)
    return [i for i in rows if bool(advantages[i].any())]


def zero_variance_groups(trajectories: Sequence[Trajectory]) -> set[str]:
    """Group ids that carry no signal: every episode got the same reward, and no credit unit
    (turn_grpo) differs from the others of its key."""
    members: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajectories:
        members[t.group_id].append(t)
    flat = set()
    for group_id, group in members.items():
        rewards = [t.reward for t in group]
        units = unit_advantages(_units_of(group))
        if max(rewards) == min(rewards) and not any(any(row) for row in units):
            flat.add(group_id)
    return flat


def zero_variance_fraction(trajectories: Sequence[Trajectory]) -> float:
    """Fraction of groups that carry no signal (`zero_variance_groups`)."""
    groups = {t.group_id for t in trajectories}
    return len(zero_variance_groups(trajectories)) / len(groups) if groups else 0.0
