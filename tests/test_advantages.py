"""grpo/algorithm/advantages.py against hand-computed numbers (fp32, CPU, atol 1e-6)."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_close_to

from grpo.algorithm.advantages import (
    broadcast_to_tokens,
    dr_grpo_advantages,
    gae,
    grpo_advantages,
    rloo_advantages,
    token_rewards_from_outcome,
    whiten_advantages,
)
from grpo.algorithm.config import GAEConfig, OutcomeAdvantageConfig
from grpo.algorithm.estimators import ESTIMATORS, trajectory_advantages
from grpo.algorithm.loss import LossSettings
from grpo.trajectory import Trajectory


def tensor(*rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


# Group [1, 2, 3, 6]: mean 3, deviations [-2, -1, 0, 3], population variance (4+1+0+9)/4 = 3.5,
# population std 1.8708287 (the sample std, 2.1602469, would give different numbers).
GROUP = [1.0, 2.0, 3.0, 6.0]


def test_grpo_normalises_by_the_population_std():
    # [-2, -1, 0, 3] / (1.8708287 + 1e-6)
    expected = [d / (1.8708287 + 1e-6) for d in (-2, -1, 0, 3)]
    assert_close_to(grpo_advantages(tensor(GROUP)), [expected])
    # [1, 0, 0, 1]: mean 0.5, std 0.5 -> +-0.5 / (0.5 + 1e-6)
    assert_close_to(grpo_advantages(tensor([1, 0, 0, 1])), [[a * 0.5 / 0.500001 for a in (1, -1, -1, 1)]])


def test_grpo_without_std_and_dr_grpo_subtract_the_mean_only():
    assert_close_to(grpo_advantages(tensor(GROUP), normalize_std=False), [[-2, -1, 0, 3]])
    assert_close_to(dr_grpo_advantages(tensor(GROUP)), [[-2, -1, 0, 3]])


def test_rloo_uses_the_mean_of_the_other_episodes():
    # sum 12; mean of the others: 11/3, 10/3, 9/3, 6/3 -> A = [1 - 11/3, 2 - 10/3, 0, 6 - 2]
    assert_close_to(rloo_advantages(tensor(GROUP)), [[-8 / 3, -4 / 3, 0.0, 4.0]])


def test_groups_are_independent():
    rewards = tensor(GROUP, [10.0, 10.0, 12.0, 12.0])
    # second group: mean 11, deviations [-1, -1, 1, 1], std 1
    assert_close_to(dr_grpo_advantages(rewards)[1], [-1, -1, 1, 1])
    assert_close_to(grpo_advantages(rewards)[1], [-1 / 1.000001, -1 / 1.000001, 1 / 1.000001, 1 / 1.000001])


@pytest.mark.parametrize("method", ["grpo", "dr_grpo", "rloo"])
def test_zero_variance_groups_give_exactly_zero(method):
    rewards = tensor([0.9, 0.9, 0.9], [1.0, 0.0, 1.0])
    # In fp32, 0.9 - mean([0.9, 0.9, 0.9]) is 6e-8, not 0: naive (r - mean) / (std + 1e-6) ~ 0.06.
    assert (rewards[0] - rewards[0].mean()).abs().max() > 0
    advantages = ESTIMATORS[method].compute(rewards, OutcomeAdvantageConfig(estimator=method))
    assert torch.equal(advantages[0], torch.zeros(3))
    assert advantages[1].abs().min() > 0.1


def test_estimator_registry_entries():
    rewards = tensor(GROUP)
    config = OutcomeAdvantageConfig(estimator="rloo")
    assert torch.equal(ESTIMATORS["rloo"].compute(rewards, config), rloo_advantages(rewards))
    no_std = OutcomeAdvantageConfig(estimator="grpo", normalize_std=False)
    assert torch.equal(ESTIMATORS["grpo"].compute(rewards, no_std), dr_grpo_advantages(rewards))
    assert [(n, e.token_level, e.needs_values, e.per_turn) for n, e in ESTIMATORS.items()] == [
        ("grpo", False, False, False), ("dr_grpo", False, False, False), ("rloo", False, False, False),
        ("turn_grpo", False, False, True), ("gae", True, True, False)]
    # The config's estimator names and the registry's are the same set.
    names = {*OutcomeAdvantageConfig.model_fields["estimator"].annotation.__args__, "turn_grpo", "gae"}
    assert names == set(ESTIMATORS)
    with pytest.raises(ValueError, match="num_groups"):
        grpo_advantages(torch.tensor(GROUP))


# --- GAE -------------------------------------------------------------------------------------

# Three sampled tokens, reward 1 on the last; values [0.5, 0.6, 0.7]; gamma 0.9, lam 0.8.
#   delta_2 = 1 + 0.9 * 0   - 0.7 = 0.3        (terminal: next value 0)
#   delta_1 = 0 + 0.9 * 0.7 - 0.6 = 0.03
#   delta_0 = 0 + 0.9 * 0.6 - 0.5 = 0.04
#   A_2 = 0.3
#   A_1 = 0.03 + 0.72 * 0.3   = 0.246
#   A_0 = 0.04 + 0.72 * 0.246 = 0.21712
#   returns = A + V = [0.71712, 0.846, 1.0]
THREE_ADV = [0.21712, 0.246, 0.3]
THREE_RET = [0.71712, 0.846, 1.0]


def test_gae_three_tokens():
    advantages, returns = gae(
        tensor([0, 0, 1]), tensor([0.5, 0.6, 0.7]), tensor([1, 1, 1]), 0.9, 0.8
    )
    assert_close_to(advantages, [THREE_ADV])
    assert_close_to(returns, [THREE_RET])


def test_gae_skips_observation_tokens():
    # Row 0: prompt, turn 1 (2 tokens), observation (2 tokens), turn 2 (1 token), padding.
    # Only the sampled tokens are time steps, so it is the 3-token example above: the next value
    # of turn 1's last token is V at turn 2's first token (0.7), not the observation's (100).
    # Row 1: the same three steps with no gaps, then padding.
    mask = tensor([0, 1, 1, 0, 0, 1, 0], [1, 1, 1, 0, 0, 0, 0])
    values = tensor([100, 0.5, 0.6, 100, 100, 0.7, 100], [0.5, 0.6, 0.7, 100, 100, 100, 100])
    rewards = tensor([0, 0, 0, 0, 0, 1, 0], [0, 0, 1, 0, 0, 0, 0])
    advantages, returns = gae(rewards, values, mask, gamma=0.9, lam=0.8)
    a0, a1, a2 = THREE_ADV
    r0, r1, r2 = THREE_RET
    assert_close_to(advantages, [[0, a0, a1, 0, 0, a2, 0], [a0, a1, a2, 0, 0, 0, 0]])
    assert_close_to(returns, [[0, r0, r1, 0, 0, r2, 0], [r0, r1, r2, 0, 0, 0, 0]])


def test_gae_with_gamma_and_lambda_one_is_reward_to_go_minus_value():
    # gamma = lam = 1: A_t = sum of rewards from t on - V_t.
    # rewards [0.5, 0, 1] (a turn reward, then the outcome), values [0.2, 0.4, 0.1]:
    # reward-to-go [1.5, 1, 1] -> A = [1.3, 0.6, 0.9], returns = reward-to-go
    mask = tensor([1, 0, 1, 1])
    advantages, returns = gae(tensor([0.5, 0, 0, 1]), tensor([0.2, 9, 0.4, 0.1]), mask, 1.0, 1.0)
    assert_close_to(advantages, [[1.3, 0, 0.6, 0.9]])
    assert_close_to(returns, [[1.5, 0, 1.0, 1.0]])


def _gae_reference(rewards, values, mask, gamma, lam):
    """A plain per-row loop over the sampled positions, for comparison."""
    advantages = torch.zeros_like(rewards, dtype=torch.float64)
    for row in range(rewards.shape[0]):
        steps = mask[row].nonzero().flatten().tolist()
        running, next_value = 0.0, 0.0
        for t in reversed(steps):
            delta = rewards[row, t].item() + gamma * next_value - values[row, t].item()
            running = delta + gamma * lam * running
            advantages[row, t] = running
            next_value = values[row, t].item()
    return advantages.float()


def test_gae_matches_a_plain_loop_across_chunk_boundaries():
    gen = torch.Generator().manual_seed(0)
    mask = (torch.rand(3, 300, generator=gen) < 0.7).float()
    mask[2] = 0  # a row with no sampled token
    values = torch.randn(3, 300, generator=gen)
    rewards = torch.randn(3, 300, generator=gen) * mask
    advantages, returns = gae(rewards, values, mask, gamma=0.99, lam=0.95)
    expected = _gae_reference(rewards, values, mask, 0.99, 0.95)
    assert_close_to(advantages, expected, atol=1e-5)  # sums of ~200 terms in fp32
    assert_close_to(returns, (expected + values) * mask, atol=1e-5)


def test_gae_rejects_rewards_on_skipped_tokens():
    with pytest.raises(ValueError, match="loss_mask 0"):
        gae(tensor([0, 1.0]), tensor([0, 0]), tensor([1, 0]))


def test_gae_whitening_flag():
    mask = tensor([1, 1, 1, 0])
    rewards, values = tensor([0, 0, 1, 0]), tensor([0.5, 0.6, 0.7, 0])
    raw, raw_returns = gae(rewards, values, mask, 0.9, 0.8)
    whitened, returns = gae(rewards, values, mask, 0.9, 0.8, whiten=True)
    assert_close_to(returns, raw_returns)  # returns are value targets, never whitened
    assert_close_to(whitened, whiten_advantages(raw, mask))
    assert_close_to((whitened * mask).sum(), 0.0)


# --- helpers ---------------------------------------------------------------------------------


def test_broadcast_to_tokens():
    mask = tensor([0, 1, 1, 0], [1, 0, 1, 1])
    assert_close_to(broadcast_to_tokens(tensor(2.0, -1.0), mask), [[0, 2, 2, 0], [-1, 0, -1, -1]])


def test_token_rewards_from_outcome_and_turn_rewards():
    # Row 0: outcome 1.0 on its last sampled token (4), turn reward 0.25 on position 2.
    # Row 1: outcome 0.5 and a turn reward 0.25 both on its last sampled token (1): 0.75.
    # Row 2: nothing sampled, zero reward: all zeros.
    mask = tensor([0, 1, 1, 0, 1, 0], [1, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0])
    rewards = token_rewards_from_outcome(
        tensor(1.0, 0.5, 0.0), mask, [[(2, 0.25)], [(1, 0.25)], []]
    )
    assert_close_to(rewards, [[0, 0, 0.25, 0, 1.0, 0], [0, 0.75, 0, 0, 0, 0], [0] * 6])
    with pytest.raises(ValueError, match="not on a sampled token"):
        token_rewards_from_outcome(tensor(1.0, 0.5, 0.0), mask, [[(3, 0.25)], [], []])
    with pytest.raises(ValueError, match="no sampled token"):
        token_rewards_from_outcome(tensor(1.0, 0.5, 1.0), mask)


def test_whiten_advantages():
    # Sampled values [1, 2, 3, 6]: mean 3, population std 1.8708287 -> [-2, -1, 0, 3] / 1.8708287
    advantages = tensor([1, 2, 50], [3, 6, -50])
    mask = tensor([1, 1, 0], [1, 1, 0])
    s = 1.8708287
    assert_close_to(whiten_advantages(advantages, mask), [[-2 / s, -1 / s, 0], [0, 3 / s, 0]])
    assert_close_to(
        whiten_advantages(advantages, mask, shift_mean=False),
        [[1 / s, 2 / s, 0], [3 / s, 6 / s, 0]],
    )
    empty = whiten_advantages(advantages, torch.zeros(2, 3))
    assert torch.equal(empty, torch.zeros(2, 3))


# --- GAE defaults (issue 14, item 5) -----------------------------------------------------------


@pytest.mark.parametrize("length", [128, 512])
def test_gae_default_config_gives_the_first_token_the_final_reward(length):
    """A zero-initialised value head and one reward at the end of `length` sampled tokens: the
    default gamma = lam = 1 gives every token, the first included, the whole reward (the former
    defaults 0.99 / 0.95 gave the first token 0.9405^(length - 1): 4e-4 at 128, 2e-14 at 512)."""
    config = GAEConfig()
    assert (config.gamma, config.lam) == (1.0, 1.0)
    ids = list(range(4 + length))
    t = Trajectory(task_id="t", group_id="g", token_ids=ids, loss_mask=[0] * 4 + [1] * length,
                   behavior_logprobs=[0.0] * len(ids), prompt_length=4, reward=1.0)
    values = {0: torch.zeros(len(ids) - 1)}
    advantages, returns = trajectory_advantages([t], config, LossSettings(kl="off"), values=values)
    sampled = advantages[0][3:]  # target positions of the sampled tokens
    assert_close_to(sampled, torch.ones(length))
    assert_close_to(returns[0][3:], torch.ones(length))
    old = gae(tensor([0.0] * (length - 1) + [1.0]), torch.zeros(1, length), torch.ones(1, length), 0.99, 0.95)[0]
    assert float(old[0, 0]) == pytest.approx(0.9405 ** (length - 1), rel=1e-3)


def test_gae_decoupled_value_lambda_changes_only_the_returns():
    # The three-token example above with lam 0.8 for the advantages and 1.0 for the targets:
    # returns with lam 1 are the discounted reward-to-go: [0.81, 0.9, 1.0] (gamma 0.9).
    rewards, values, mask = tensor([0, 0, 1]), tensor([0.5, 0.6, 0.7]), tensor([1, 1, 1])
    advantages, returns = gae(rewards, values, mask, gamma=0.9, lam=0.8, value_lam=1.0)
    assert_close_to(advantages, [THREE_ADV])
    assert_close_to(returns, [[0.81, 0.9, 1.0]])


def test_gae_whitening_over_the_whole_step():
    """`whiten: true` whitens over every sampled token of the step's rows together."""
    trajs = [Trajectory(task_id="t", group_id=f"g{i}", token_ids=list(range(2 + n)), loss_mask=[0, 0] + [1] * n,
                        behavior_logprobs=[0.0] * (2 + n), prompt_length=2, reward=r)
             for i, (n, r) in enumerate([(3, 1.0), (5, 0.0), (2, 0.5)])]
    values = {i: torch.full((len(t.token_ids) - 1,), 0.25) for i, t in enumerate(trajs)}
    raw, _ = trajectory_advantages(trajs, GAEConfig(), LossSettings(kl="off"), values=values)
    white, _ = trajectory_advantages(trajs, GAEConfig(whiten=True), LossSettings(kl="off"), values=values)
    flat_raw = torch.cat([raw[i][1:] for i in range(3)])  # the sampled positions
    flat = torch.cat([white[i][1:] for i in range(3)])
    assert_close_to(flat, (flat_raw - flat_raw.mean()) / flat_raw.std(correction=0), atol=1e-5)
    assert all(float(white[i][0]) == 0.0 for i in range(3))  # the prompt position stays 0
