"""train_step on the tiny model: the whole update path, with hand-built trajectories."""

from __future__ import annotations

import math

import pytest
import torch

from grpo.algorithm.config import AlgorithmConfig, OptimizerConfig, ReferenceConfig
from grpo.models.config import LoraConfig, ModelConfig
from grpo.algorithm.loss import LossSettings
from grpo.models.policy import PolicyWithValueHead
from grpo.algorithm.reference import make_reference
from grpo.trajectory import Trajectory
from grpo.algorithm.update import (
    LogprobMismatchError,
    NonFiniteLossError,
    UpdateSettings,
    make_scheduler,
    train_step,
)


def _policy(value_head: bool = True) -> PolicyWithValueHead:
    policy, _ = PolicyWithValueHead.from_config(
        ModelConfig(name_or_path="tiny-random", dtype="float32", value_head=value_head),
        LoraConfig(),
        device="cpu",
        seed=0,
    )
    return policy


def _trajectories(policy, rewards: list[list[float]], seed: int = 0) -> list[Trajectory]:
    """Groups of random sequences: a prompt, a sampled turn, an observation, a second turn.
    behavior_logprobs are the policy's own, as an exact fp32 engine would report them."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for g, group in enumerate(rewards):
        for j, reward in enumerate(group):
            prompt, turn1, obs, turn2 = (int(torch.randint(3, 9, (1,), generator=gen)) for _ in range(4))
            ids = torch.randint(100, 5000, (prompt + turn1 + obs + turn2,), generator=gen).tolist()
            mask = [0] * prompt + [1] * turn1 + [0] * obs + [1] * turn2
            with torch.no_grad():
                lp = policy(torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long)).logprobs[0]
            behavior = [0.0] + [float(lp[i - 1]) if mask[i] else 0.0 for i in range(1, len(ids))]
            out.append(Trajectory(task_id=f"t{g}", group_id=f"g{g}", token_ids=ids, loss_mask=mask,
                                  behavior_logprobs=behavior, prompt_length=prompt, reward=reward))
    return out


def _settings(*, loss=None, advantage="grpo", skip_zero_advantage=True, **schedule) -> UpdateSettings:
    schedule.setdefault("micro_batch_size", 4)
    return UpdateSettings(loss=LossSettings(**(loss or {})),
                          advantage=AlgorithmConfig(advantage=advantage).advantage,
                          schedule=OptimizerConfig(**schedule), skip_zero_advantage=skip_zero_advantage)


def _adam(policy, lr=1e-3):
    opt = torch.optim.AdamW(policy.trainable_parameters(), lr=lr)
    return opt, make_scheduler(opt, OptimizerConfig(warmup_steps=0))


def _snapshot(policy):
    return [p.detach().clone() for p in policy.trainable_parameters()]


def test_on_policy_single_pass_has_ratio_exactly_one_and_updates_weights():
    policy = _policy(value_head=False)
    trajs = _trajectories(policy, [[1.0, 0.0, 0.0, 1.0], [0.0, 1.0, 1.0, 1.0]])
    before = _snapshot(policy)
    opt, sched = _adam(policy)
    stats = train_step(policy, None, opt, sched, trajs, _settings(loss={"kl": "off"}))
    assert stats["train/ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert stats["train/ratio_std"] == pytest.approx(0.0, abs=1e-6)
    assert stats["train/clip_frac"] == 0.0
    assert stats["train/logprob_mismatch"] < 1e-5
    assert all(math.isfinite(v) for v in stats.values())
    assert any(not torch.equal(a, b) for a, b in zip(before, _snapshot(policy)))


@pytest.mark.parametrize("check", [False, True])
def test_mismatch_distribution_reports_mean_median_p99_and_max(check):
    """Engine log-probs offset by 0.01 on every sampled token but one, which is off by 0.3:
    the no-grad pass (step-0 check) and the first forward (no pass) report the same figures."""
    policy = _policy(value_head=False)
    trajs = _trajectories(policy, [[1.0, 0.0], [0.0, 1.0]])
    first = True
    for t in trajs:
        shifted = []
        for lp, m in zip(t.behavior_logprobs, t.loss_mask):
            offset = (0.3 if first else 0.01) if m else 0.0
            first = first and not m
            shifted.append(lp + offset)
        t.behavior_logprobs = shifted
    n = sum(sum(t.loss_mask[1:]) for t in trajs)
    opt, sched = _adam(policy)
    stats = train_step(policy, None, opt, sched, trajs, _settings(loss={"kl": "off"}),
                       check_logprobs=check)
    assert stats["train/logprob_mismatch"] == pytest.approx((0.3 + 0.01 * (n - 1)) / n, abs=1e-5)
    assert stats["train/logprob_mismatch_p50"] == pytest.approx(0.01, abs=1e-5)
    assert stats["train/logprob_mismatch_max"] == pytest.approx(0.3, abs=1e-5)
    # p99 interpolates between the two largest of n values: 0.01 + frac * 0.29
    frac = 0.99 * (n - 1) - math.floor(0.99 * (n - 1))
    assert stats["train/logprob_mismatch_p99"] == pytest.approx(0.01 + frac * 0.29, abs=1e-4)


def test_step0_check_refuses_mismatched_engine_logprobs_and_leaves_weights_alone():
    policy = _policy(value_head=False)
    trajs = _trajectories(policy, [[1.0, 0.0]])
    for t in trajs:
        t.behavior_logprobs = [lp - 0.5 if m else 0.0 for lp, m in zip(t.behavior_logprobs, t.loss_mask)]
    before = _snapshot(policy)
    opt, sched = _adam(policy)
    with pytest.raises(LogprobMismatchError, match=r"mean \|trainer - engine\| log-prob .* 0\.5000"):
        train_step(policy, None, opt, sched, trajs, _settings(loss={"kl": "off"}), check_logprobs=True)
    assert all(torch.equal(a, b) for a, b in zip(before, _snapshot(policy)))


def test_zero_variance_groups_give_no_policy_gradient():
    policy = _policy(value_head=False)
    trajs = _trajectories(policy, [[1.0, 1.0], [0.0, 0.0]])
    opt, sched = _adam(policy)
    stats = train_step(policy, None, opt, sched, trajs,
                       _settings(loss={"kl": "off"}, skip_zero_advantage=False))
    assert stats["train/zero_variance_groups"] == 1.0
    assert stats["train/grad_norm"] == 0.0
    assert stats["train/policy_loss"] == 0.0


def test_zero_advantage_sequences_are_skipped_without_changing_the_update():
    # Group g1 has equal rewards (advantage 0): skipping it must give exactly the same weights,
    # because the denominator still counts its tokens.
    results = []
    for skip in (False, True):
        policy = _policy(value_head=False)
        trajs = _trajectories(policy, [[1.0, 0.0, 0.0, 0.0], [0.5, 0.5, 0.5, 0.5]])
        opt = torch.optim.SGD(policy.trainable_parameters(), lr=1.0)
        stats = train_step(policy, None, opt, make_scheduler(opt, OptimizerConfig()), trajs,
                           _settings(loss={"kl": "off"}, skip_zero_advantage=skip))
        assert stats["train/skipped_sequences"] == (0.5 if skip else 0.0)
        results.append(_snapshot(policy))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_all_zero_advantages_skip_the_optimizer_step():
    policy = _policy(value_head=False)
    trajs = _trajectories(policy, [[0.0, 0.0], [1.0, 1.0]])
    before = _snapshot(policy)
    opt, sched = _adam(policy)
    stats = train_step(policy, None, opt, sched, trajs, _settings(loss={"kl": "off"}))
    assert stats["train/skipped_sequences"] == 1.0 and stats["train/optimizer_steps"] == 0.0
    assert all(torch.equal(a, b) for a, b in zip(before, _snapshot(policy)))


def test_micro_batch_size_does_not_change_the_gradient():
    # SGD: the update is lr * gradient, so any error in the accumulation denominator shows.
    results = []
    for micro in (1, 3, 8):
        policy = _policy(value_head=False)
        trajs = _trajectories(policy, [[1.0, 0.0, 0.5, 0.0], [0.2, 1.0, 0.0, 0.0]])
        opt = torch.optim.SGD(policy.trainable_parameters(), lr=1.0)
        sched = make_scheduler(opt, OptimizerConfig())
        train_step(policy, None, opt, sched, trajs,
                   _settings(loss={"kl": "off", "loss_agg": "seq_mean_token_mean"}, micro_batch_size=micro))
        results.append(_snapshot(policy))
    for other in results[1:]:
        for a, b in zip(results[0], other):
            torch.testing.assert_close(a, b, atol=2e-6, rtol=0)


def test_several_epochs_move_ratios_and_report_kl_to_reference():
    policy = _policy(value_head=False)
    reference = make_reference(policy, ReferenceConfig(ema_decay=1.0, update_every=1))
    trajs = _trajectories(policy, [[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]])
    opt, sched = _adam(policy, lr=3e-3)
    settings = _settings(loss={"kl_coef": 0.1, "clip_low": 0.1, "clip_high": 0.1}, ppo_epochs=3,
                         num_minibatches=2)
    stats = train_step(policy, reference, opt, sched, trajs, settings)
    assert stats["train/ratio_std"] > 1e-4  # the policy moved between minibatches
    assert stats["train/kl_ref"] > 0.0  # and away from the frozen reference
    assert stats["train/clip_frac"] > 0.0
    assert opt.state[policy.trainable_parameters()[0]]["step"] == 6  # 3 epochs x 2 minibatches


def test_gae_trains_the_value_head():
    policy = _policy(value_head=True)
    trajs = _trajectories(policy, [[1.0, 0.0], [0.0, 1.0]])
    opt, sched = _adam(policy)
    head_before = policy.value_head.weight.detach().clone()
    stats = train_step(policy, None, opt, sched, trajs, _settings(loss={"kl": "off"}, advantage="gae"))
    assert stats["train/value_loss"] > 0.0
    assert not torch.equal(head_before, policy.value_head.weight)


def test_non_finite_reward_skips_the_update():
    policy = _policy(value_head=False)
    trajs = _trajectories(policy, [[float("nan"), 0.0]])
    before = _snapshot(policy)
    opt, sched = _adam(policy)
    with pytest.raises(NonFiniteLossError):
        train_step(policy, None, opt, sched, trajs, _settings(loss={"kl": "off"}))
    assert all(torch.equal(a, b) for a, b in zip(before, _snapshot(policy)))


def test_kl_in_reward_lowers_the_reward_of_the_sequence_that_drifted():
    policy = _policy(value_head=False)
    reference = make_reference(policy, ReferenceConfig(ema_decay=1.0))
    with torch.no_grad():  # move the policy away from its reference
        for p in policy.trainable_parameters():
            p.add_(0.05 * torch.randn_like(p))
    trajs = _trajectories(policy, [[1.0, 1.0]])
    opt, sched = _adam(policy)
    stats = train_step(policy, reference, opt, sched, trajs,
                       _settings(loss={"kl_coef": 1.0, "kl": "reward", "kl_estimator": "k1"}))
    # Equal rewards, but the KL penalties differ: the group is no longer zero-variance in effect.
    assert stats["train/grad_norm"] > 0.0
    assert "train/kl_loss" not in stats
