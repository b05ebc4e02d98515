"""Turn-level GRPO (grpo/algorithm/turn_advantages.py, `estimator: turn_grpo`) against
hand-computed numbers: unit advantages by key with every episode weighing the same, the turn
advantage added to its own tokens only, nothing gained by splitting a turn, and the groups that
carry signal."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_close_to

from grpo.algorithm.config import AlgorithmConfig, OutcomeAdvantageConfig, TurnAdvantageConfig
from grpo.algorithm.estimators import (
    trajectory_advantages,
    zero_variance_fraction,
    zero_variance_groups,
)
from grpo.algorithm.loss import LossSettings
from grpo.algorithm.turn_advantages import unit_advantages
from grpo.config import RunConfig
from grpo.trajectory import CreditSpan, Trajectory

OFF = LossSettings(kl="off")


def assert_rows(actual: list[list[float]], expected: list[list[float]], rel: float = 1e-9) -> None:
    assert [len(row) for row in actual] == [len(row) for row in expected]
    for got, want in zip(actual, expected):
        assert got == pytest.approx(want, rel=rel, abs=1e-12)


def test_units_are_compared_with_the_units_of_their_key():
    # progress=0: scores 1, 0 -> mean 0.5; progress=1: 1, 0, 0 over three episodes -> mean 1/3.
    units = [[("progress=0", 1.0), ("progress=1", 1.0)],
             [("progress=0", 0.0)],
             [("progress=0", 1.0), ("progress=1", 0.0)],
             [("progress=0", 0.0), ("progress=1", 0.0)]]
    assert_rows(unit_advantages(units, normalize_std=False), [[0.5, 2 / 3], [-0.5], [0.5, -1 / 3], [-0.5, -1 / 3]])
    # std at progress=0 is 0.5, at progress=1 sqrt(2/9) = 0.4714045
    normalised = unit_advantages(units)
    assert normalised[0] == pytest.approx([0.5 / 0.500001, (2 / 3) / (0.4714045 + 1e-6)], rel=1e-6)
    assert normalised[3] == pytest.approx([-0.5 / 0.500001, (-1 / 3) / (0.4714045 + 1e-6)], rel=1e-6)


def test_every_episode_weighs_the_same_whatever_its_number_of_units():
    # Episode 0 retried a failing call three times: its mean at the key is 1/4, not three votes of 0.
    units = [[("k", 0.0), ("k", 0.0), ("k", 0.0), ("k", 1.0)], [("k", 1.0)], [("k", 0.0)]]
    baseline = (0.25 + 1.0 + 0.0) / 3  # 0.41667; the mean over units would be 2/6 = 0.3333
    advantages = unit_advantages(units, normalize_std=False)
    assert_rows(advantages, [[-baseline] * 3 + [1 - baseline], [1 - baseline], [-baseline]])
    # Weighted by episode, the advantages at the key average to zero: each episode's mean, averaged.
    per_episode = [sum(row) / len(row) for row in advantages]
    assert sum(per_episode) == pytest.approx(0.0, abs=1e-12)
    # The spread under the same weights: units of episode 0 weigh 1/12 each, the others 1/3.
    variance = 3 / 12 * baseline ** 2 + 1 / 12 * (1 - baseline) ** 2 + 1 / 3 * (1 - baseline) ** 2 + 1 / 3 * baseline ** 2
    assert unit_advantages(units)[1][0] == pytest.approx((1 - baseline) / (variance ** 0.5 + 1e-6), rel=1e-6)


def test_a_key_one_episode_reached_or_whose_units_agree_gives_exactly_zero():
    units = [[("a", 1.0), ("b", 1.0)], [("a", 1.0), ("c", 0.0), ("c", 1.0)], [("a", 1.0)]]
    assert unit_advantages(units) == [[0.0, 0.0], [0.0, 0.0, 0.0], [0.0]]


def trajectory(group: str, reward: float, turns: list[int], credit: list[tuple[int, float, str]],
               prompt: int = 3) -> Trajectory:
    """A trajectory whose sampled turns have the given lengths, one observation token between
    them; credit units as (turn index 0-based, score, key)."""
    ids, mask, spans = [0] * prompt, [0] * prompt, []
    for k, length in enumerate(turns):
        if k:
            ids.append(0)
            mask.append(0)
        spans.append((len(ids), len(ids) + length))
        ids += [1] * length
        mask += [1] * length
    return Trajectory(task_id=group, group_id=group, token_ids=ids, loss_mask=mask, behavior_logprobs=[0.0] * len(ids),
                      prompt_length=prompt, reward=reward,
                      credit=[CreditSpan(*spans[turn], score, key) for turn, score, key in credit])


def test_turn_grpo_adds_each_turns_unit_advantage_to_that_turns_tokens_only():
    group = [
        # right first call, wrong second call, wrong answer
        trajectory("g", 0.0, [2, 2, 1], [(0, 1.0, "progress=0"), (1, 0.0, "progress=1")]),
        # both calls right, right answer
        trajectory("g", 1.0, [2, 2, 1], [(0, 1.0, "progress=0"), (1, 1.0, "progress=1")]),
    ]
    config = TurnAdvantageConfig(normalize_std=False)
    advantages, _ = trajectory_advantages(group, config, OFF)
    # outcome: -0.5 / +0.5; progress=0 units agree (0); progress=1: 0 vs 1 -> -0.5 / +0.5.
    # Target positions: prompt 3 -> turn 1 at positions 2-3, observation at 4, turn 2 at 5-6,
    # observation at 7, the answer turn at 8.
    assert_close_to(advantages[0], [0, 0, -0.5, -0.5, 0, -1.0, -1.0, 0, -0.5])
    assert_close_to(advantages[1], [0, 0, 0.5, 0.5, 0, 1.0, 1.0, 0, 0.5])
    # The right first call of the failed episode is pushed down by the outcome only; turn_weight 2
    # doubles the turn part alone.
    doubled, _ = trajectory_advantages(group, TurnAdvantageConfig(normalize_std=False, turn_weight=2.0), OFF)
    assert_close_to(doubled[0], [0, 0, -0.5, -0.5, 0, -1.5, -1.5, 0, -0.5])


def test_without_units_or_with_turn_weight_zero_it_is_grpo():
    group = [trajectory("g", r, [2, 1], [(0, s, "progress=0")]) for r, s in ((1.0, 1.0), (0.0, 0.0), (0.5, 1.0))]
    grpo, _ = trajectory_advantages(group, OutcomeAdvantageConfig(), OFF)
    weightless, _ = trajectory_advantages(group, TurnAdvantageConfig(turn_weight=0.0), OFF)
    bare = [trajectory("g", t.reward, [2, 1], []) for t in group]
    unitless, _ = trajectory_advantages(bare, TurnAdvantageConfig(), OFF)
    for i in range(3):
        assert torch.equal(weightless[i], grpo[i]) and torch.equal(unitless[i], grpo[i])


def test_splitting_a_turn_into_two_gains_nothing():
    others = [trajectory("g", 0.0, [4, 1], [(0, 1.0, "progress=0"), (0, 0.0, "progress=1")]),
              trajectory("g", 0.0, [2, 1], [(0, 0.0, "progress=0")]),
              trajectory("g", 1.0, [2, 2, 1], [(0, 1.0, "progress=0"), (1, 1.0, "progress=1")])]
    # Episode 0 makes both calls in one turn of 4 tokens, or in two turns of 2 tokens each.
    joined = trajectory("g", 1.0, [4, 1], [(0, 1.0, "progress=0"), (0, 1.0, "progress=1")])
    split = trajectory("g", 1.0, [2, 2, 1], [(0, 1.0, "progress=0"), (1, 1.0, "progress=1")])
    config = TurnAdvantageConfig()
    with_joined, _ = trajectory_advantages([joined, *others], config, OFF)
    with_split, _ = trajectory_advantages([split, *others], config, OFF)
    assert float(with_joined[0].sum()) == pytest.approx(float(with_split[0].sum()), abs=1e-5)
    for i in (1, 2, 3):
        assert torch.equal(with_joined[i], with_split[i])  # nobody else's advantage moves either


def test_a_group_with_equal_rewards_carries_signal_when_its_units_differ():
    wasted = trajectory("same", 1.0, [2, 2, 1], [(0, 0.0, "progress=0"), (1, 1.0, "progress=0")])
    direct = trajectory("same", 1.0, [2, 1], [(0, 1.0, "progress=0")])
    flat = [trajectory("flat", 1.0, [2, 1], [(0, 1.0, "progress=0")]) for _ in range(2)]
    assert zero_variance_groups([wasted, direct, *flat]) == {"flat"}
    assert zero_variance_fraction([wasted, direct, *flat]) == 0.5
    advantages, _ = trajectory_advantages([wasted, direct], TurnAdvantageConfig(normalize_std=False), OFF)
    # progress=0: episode means 0.5 and 1 -> baseline 0.75; the wasted call -0.75, its retry +0.25
    assert_close_to(advantages[0], [0, 0, -0.75, -0.75, 0, 0.25, 0.25, 0, 0.0])


def test_turn_grpo_is_chosen_by_name_and_needs_verified_credit_on_mcp_tasks():
    assert isinstance(AlgorithmConfig(advantage="turn_grpo").advantage, TurnAdvantageConfig)
    with pytest.raises(ValueError, match="turn_grpo needs per-turn credit: set environment.turn_credit: verified"):
        RunConfig.model_validate({"algorithm": {"advantage": "turn_grpo"}})
    config = RunConfig.model_validate({"algorithm": {"advantage": {"estimator": "turn_grpo", "turn_weight": 0.5}},
                                       "environment": {"turn_credit": "verified"}})
    assert config.algorithm.advantage.turn_weight == 0.5
