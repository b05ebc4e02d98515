"""train_step on the tiny model: the whole update path, with hand-built trajectories.

Against the engine's log-probs (mismatch figures, the step-0 check, behaviour correction,
nucleus sampling refused): tests/test_update_engine_mismatch.py."""

from __future__ import annotations

import math

import pytest
import torch
from update_helpers import (
    adam,
    drift,
    make_policy,
    make_settings,
    make_trajectories,
    sgd,
    snapshot,
    weight_delta,
)

from grpo.algorithm import update as update_module
from grpo.algorithm.advantages import grpo_advantages
from grpo.algorithm.config import OptimizerConfig, ReferenceConfig
from grpo.algorithm.loss import kl_per_token
from grpo.algorithm.reference import make_reference
from grpo.algorithm.update import NonFiniteLossError, make_grad_scaler, make_scheduler, train_step
from grpo.models.config import LoraConfig, ModelConfig
from grpo.models.policy import PolicyWithValueHead
from grpo.trajectory import Trajectory


def _row_logprobs(policy, t: Trajectory) -> torch.Tensor:
    """[n] the policy's log-prob of each sampled token of `t` (0 elsewhere), one row alone."""
    lp = policy(torch.tensor([t.token_ids]), torch.ones(1, len(t.token_ids), dtype=torch.long)).logprobs[0]
    return torch.where(torch.tensor(t.loss_mask[1:], dtype=torch.bool), lp, 0.0)


def test_on_policy_ratio_against_the_scoring_pass_is_one_and_the_update_is_the_policy_gradient():
    """Old log-probs from the separate no-grad scoring pass (eval mode, other batch shapes), so a
    ratio of 1 is measured, not built in; and the update equals the hand-built policy gradient
    -sum_i A_i sum_t grad log pi / N (token_mean, ratio 1, weights 1 with an exact engine)."""
    policy = make_policy(value_head=False)
    rewards = [[1.0, 0.0, 0.0, 1.0], [0.0, 1.0, 1.0, 1.0]]
    trajs = make_trajectories(policy, rewards)
    advantages = grpo_advantages(torch.tensor(rewards)).flatten()  # [8], rows in group order
    copy = make_policy(value_head=False)  # the same weights (seed 0)
    surrogate = sum(a * _row_logprobs(copy, t).sum() for a, t in zip(advantages, trajs))
    tokens = sum(sum(t.loss_mask[1:]) for t in trajs)
    expected = torch.autograd.grad(-surrogate / tokens, copy.trainable_parameters())
    before = snapshot(policy)
    opt, sched = sgd(policy)
    stats = train_step(policy, None, opt, sched, trajs, make_settings(loss={"kl": "off"}, max_grad_norm=1e9),
                       check_logprobs=True)
    assert stats["train/ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert stats["train/ratio_std"] < 1e-6
    assert stats["train/clip_frac"] == 0.0 and stats["train/logprob_mismatch"] < 1e-5
    assert stats["train/is_weight_mean"] == pytest.approx(1.0, abs=1e-6)
    assert all(math.isfinite(v) for v in stats.values())
    for grad, old, new in zip(expected, before, snapshot(policy), strict=True):
        torch.testing.assert_close(old - new, grad, atol=1e-6, rtol=1e-4)
    assert max(float(g.abs().max()) for g in expected) > 1e-3


def test_zero_variance_groups_give_no_policy_gradient():
    policy = make_policy(value_head=False)
    trajs = make_trajectories(policy, [[1.0, 1.0], [0.0, 0.0]])
    opt, sched = adam(policy)
    stats = train_step(policy, None, opt, sched, trajs,
                       make_settings(loss={"kl": "off"}, skip_zero_advantage=False))
    assert stats["train/zero_variance_groups"] == 1.0
    assert stats["train/grad_norm"] == 0.0
    assert stats["train/policy_loss"] == 0.0


def test_zero_advantage_sequences_are_skipped_without_changing_the_update():
    # Group g1 has equal rewards (advantage 0): skipping it must give exactly the same weights,
    # because the denominator still counts its tokens.
    results = []
    for skip in (False, True):
        policy = make_policy(value_head=False)
        trajs = make_trajectories(policy, [[1.0, 0.0, 0.0, 0.0], [0.5, 0.5, 0.5, 0.5]])
        opt = torch.optim.SGD(policy.trainable_parameters(), lr=1.0)
        stats = train_step(policy, None, opt, make_scheduler(opt, OptimizerConfig()), trajs,
                           make_settings(loss={"kl": "off"}, skip_zero_advantage=skip))
        assert stats["train/skipped_sequences"] == (0.5 if skip else 0.0)
        results.append(snapshot(policy))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_all_zero_advantages_skip_the_optimizer_step():
    policy = make_policy(value_head=False)
    trajs = make_trajectories(policy, [[0.0, 0.0], [1.0, 1.0]])
    before = snapshot(policy)
    opt, sched = adam(policy)
    stats = train_step(policy, None, opt, sched, trajs, make_settings(loss={"kl": "off"}))
    assert stats["train/skipped_sequences"] == 1.0 and stats["train/optimizer_steps"] == 0.0
    assert all(torch.equal(a, b) for a, b in zip(before, snapshot(policy)))


def test_micro_batch_size_does_not_change_the_gradient():
    # SGD: the update is lr * gradient, so any error in the accumulation denominator shows.
    results = []
    for micro in (1, 3, 8):
        policy = make_policy(value_head=False)
        trajs = make_trajectories(policy, [[1.0, 0.0, 0.5, 0.0], [0.2, 1.0, 0.0, 0.0]])
        opt = torch.optim.SGD(policy.trainable_parameters(), lr=1.0)
        sched = make_scheduler(opt, OptimizerConfig())
        train_step(policy, None, opt, sched, trajs,
                   make_settings(loss={"kl": "off", "loss_agg": "seq_mean_token_mean"}, micro_batch_size=micro))
        results.append(snapshot(policy))
    for other in results[1:]:
        for a, b in zip(results[0], other):
            torch.testing.assert_close(a, b, atol=2e-6, rtol=0)


def test_micro_batch_tokens_does_not_change_the_gradient():
    results = []
    for micro, tokens in ((8, None), (8, 1), (8, 30), (2, 1000)):
        policy = make_policy(value_head=False)
        trajs = make_trajectories(policy, [[1.0, 0.0, 0.5, 0.0], [0.2, 1.0, 0.0, 0.0]])
        opt = torch.optim.SGD(policy.trainable_parameters(), lr=1.0)
        sched = make_scheduler(opt, OptimizerConfig())
        train_step(policy, None, opt, sched, trajs,
                   make_settings(loss={"kl": "off", "loss_agg": "seq_mean_token_mean"},
                                 micro_batch_size=micro, micro_batch_tokens=tokens))
        results.append(snapshot(policy))
    for other in results[1:]:
        for a, b in zip(results[0], other):
            torch.testing.assert_close(a, b, atol=2e-6, rtol=0)


def test_several_epochs_move_ratios_and_report_kl_to_reference():
    policy = make_policy(value_head=False)
    reference = make_reference(policy, ReferenceConfig(ema_decay=1.0, update_every=1))
    trajs = make_trajectories(policy, [[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]])
    opt, sched = adam(policy, lr=3e-3)
    settings = make_settings(loss={"kl_coef": 0.1, "clip_low": 0.1, "clip_high": 0.1}, ppo_epochs=3,
                             num_minibatches=2)
    stats = train_step(policy, reference, opt, sched, trajs, settings)
    assert stats["train/ratio_std"] > 1e-4  # the policy moved between minibatches
    assert stats["train/kl_ref"] > 0.0  # and away from the frozen reference
    assert stats["train/clip_frac"] > 0.0
    assert opt.state[policy.trainable_parameters()[0]]["step"] == 6  # 3 epochs x 2 minibatches


def test_gae_losses_have_the_predicted_values_and_the_head_moves_toward_the_returns():
    # The head starts at 0, so with the default gamma = lam = 1 every sampled token's return and
    # advantage is its episode's reward r_i: value loss 0.5 sum_i n_i r_i^2 / N, policy loss
    # -sum_i n_i r_i / N (ratio 1); the clipped value branch equals the unclipped one at V = V_old.
    policy = make_policy(value_head=True)
    rewards = [1.0, 0.0, 0.0, 0.5]
    trajs = make_trajectories(policy, [rewards[:2], rewards[2:]])
    n = [sum(t.loss_mask[1:]) for t in trajs]
    opt, sched = adam(policy)
    settings = make_settings(loss={"kl": "off"}, advantage="gae")
    stats = train_step(policy, None, opt, sched, trajs, settings)
    assert stats["train/value_loss"] == pytest.approx(0.5 * sum(k * r * r for k, r in zip(n, rewards)) / sum(n), abs=1e-6)
    assert stats["train/policy_loss"] == pytest.approx(-sum(k * r for k, r in zip(n, rewards)) / sum(n), abs=1e-5)
    again = train_step(policy, None, *adam(policy, lr=0.0), trajs, settings)  # lr 0: only measures
    assert again["train/value_loss"] < stats["train/value_loss"] - 1e-4


def test_non_finite_reward_skips_the_update():
    policy = make_policy(value_head=False)
    trajs = make_trajectories(policy, [[float("nan"), 0.0]])
    before = snapshot(policy)
    opt, sched = adam(policy)
    with pytest.raises(NonFiniteLossError):
        train_step(policy, None, opt, sched, trajs, make_settings(loss={"kl": "off"}))
    assert all(torch.equal(a, b) for a, b in zip(before, snapshot(policy)))


def test_kl_in_reward_lowers_the_reward_of_the_sequence_that_drifted():
    policy = make_policy(value_head=False)
    reference = make_reference(policy, ReferenceConfig(ema_decay=1.0))
    drift(policy)
    trajs = make_trajectories(policy, [[1.0, 1.0]])
    # By hand: reward_i - kl_coef * sum_t k1(old, ref), then GRPO over the pair; with ratio 1 the
    # policy loss is -sum_i A_i n_i / N.
    with torch.no_grad():
        penalties = [float(kl_per_token(_row_logprobs(policy, t), _row_logprobs(reference.model, t), "k1").sum())
                     for t in trajs]
    advantages = grpo_advantages(torch.tensor([[1.0 - p for p in penalties]]))[0]
    n = [sum(t.loss_mask[1:]) for t in trajs]
    opt, sched = adam(policy)
    stats = train_step(policy, reference, opt, sched, trajs,
                       make_settings(loss={"kl_coef": 1.0, "kl": "reward", "kl_estimator": "k1"}))
    assert abs(penalties[0] - penalties[1]) > 0.05  # the two sequences drifted by different amounts
    assert float(advantages[penalties.index(max(penalties))]) < -0.99  # the one that drifted more
    assert stats["train/policy_loss"] == pytest.approx(-float(advantages @ torch.tensor(n, dtype=torch.float)) / sum(n), abs=1e-5)
    assert "train/kl_loss" not in stats and stats["train/skipped_sequences"] == 0.0


# ----- one objective for every parallelism (item 3) -----------------------------------------------
def test_zero_advantage_rows_keep_their_kl_gradient_under_the_default_config():
    """KL in the loss (the default): a zero-advantage sequence still has the KL gradient, so it is
    not skipped, and skipping on (one process) or off (data-parallel ranks) is the same update."""
    results = []
    for skip in (True, False):
        policy = make_policy(value_head=False)
        reference = make_reference(policy, ReferenceConfig(ema_decay=1.0))
        drift(policy)
        trajs = make_trajectories(policy, [[1.0, 0.0, 0.0, 0.0], [0.5, 0.5, 0.5, 0.5]])
        opt, sched = sgd(policy)
        stats = train_step(policy, reference, opt, sched, trajs,
                           make_settings(loss={"kl_coef": 0.1}, skip_zero_advantage=skip, max_grad_norm=1e9))
        assert stats["train/skipped_sequences"] == 0.0
        results.append((snapshot(policy), stats["train/kl_loss"]))
    assert results[0][1] == pytest.approx(results[1][1], abs=1e-7)
    for a, b in zip(results[0][0], results[1][0], strict=True):
        torch.testing.assert_close(a, b, atol=1e-7, rtol=0)


# ----- all or nothing (item 6) --------------------------------------------------------------------
def test_a_non_finite_loss_in_a_later_minibatch_undoes_the_whole_update():
    policy = make_policy(value_head=False)
    trajs = make_trajectories(policy, [[1.0, 0.0, 0.0, 1.0], [0.0, 1.0, 1.0, 1.0]])
    settings = make_settings(loss={"kl": "off"}, ppo_epochs=2, num_minibatches=2, micro_batch_size=8)
    opt, sched = adam(policy)
    train_step(policy, None, opt, sched, trajs, settings)  # a clean update: Adam has state now
    forward, calls = policy.forward, []

    def third_forward_is_nan(*args, **kwargs):
        out = forward(*args, **kwargs)
        if torch.is_grad_enabled():
            calls.append(1)
            if len(calls) == 3:  # epoch 2, minibatch 1: two optimizer steps were applied before
                out.logprobs = out.logprobs * float("nan")
        return out

    policy.forward = third_forward_is_nan
    before, lr_before = snapshot(policy), sched.get_last_lr()
    adam_before = {k: {n: v.clone() for n, v in state.items()} for k, state in opt.state_dict()["state"].items()}
    with pytest.raises(NonFiniteLossError):
        train_step(policy, None, opt, sched, trajs, settings)
    assert len(calls) == 3
    assert all(torch.equal(a, b) for a, b in zip(before, snapshot(policy), strict=True))
    adam_after = opt.state_dict()["state"]
    assert adam_after.keys() == adam_before.keys()
    assert all(torch.equal(adam_after[k][n], v) for k, state in adam_before.items() for n, v in state.items())
    assert float(adam_after[0]["step"]) == 4 and sched.last_epoch == 4 and sched.get_last_lr() == lr_before


# ----- dropout, entropy, minibatch order (items 8, 9) ---------------------------------------------
def test_lora_dropout_puts_no_noise_into_the_first_ratio():
    policy, _ = PolicyWithValueHead.from_config(
        ModelConfig(name_or_path="tiny-random", dtype="float32", value_head=False),
        LoraConfig(enabled=True, dropout=0.5), device="cpu", seed=0)
    with torch.no_grad():  # B starts at 0, which would hide the dropout on the adapter's input
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(1))
    policy.eval()  # the engine samples without dropout
    trajs = make_trajectories(policy, [[1.0, 0.0, 0.0, 1.0]])
    stats = train_step(policy, None, *adam(policy), trajs, make_settings(loss={"kl": "off"}), check_logprobs=True)
    assert stats["train/ratio_std"] < 1e-6 and stats["train/ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert stats["train/is_weight_mean"] == pytest.approx(1.0, abs=1e-5)


def test_entropy_is_computed_only_when_its_coefficient_needs_it():
    policy = make_policy(value_head=False)
    trajs = make_trajectories(policy, [[1.0, 0.0, 0.0, 1.0]])
    forward, asked = policy.forward, []

    def spy(*args, **kwargs):
        asked.append(kwargs.get("with_entropy", False))
        return forward(*args, **kwargs)

    # The sampled tokens' mean -log pi estimates the entropy for free.
    with torch.no_grad():
        lps = torch.cat([_row_logprobs(policy, t)[torch.tensor(t.loss_mask[1:], dtype=torch.bool)] for t in trajs])
    policy.forward = spy
    stats = train_step(policy, None, *adam(policy), trajs, make_settings(loss={"kl": "off"}))
    assert asked == [False] and "train/entropy" not in stats
    assert stats["train/entropy_estimate"] == pytest.approx(float(-lps.mean()), abs=1e-5)
    asked.clear()
    stats = train_step(policy, None, *adam(policy), trajs, make_settings(loss={"kl": "off", "entropy_coef": 0.01}))
    assert asked == [True] and stats["train/entropy"] > 0


def test_every_step_draws_its_own_minibatch_order(monkeypatch):
    seen: list[list[int]] = []
    original = update_module.micro_batches

    def spy(trajectories, rows, *args, **kwargs):
        seen.append(sorted(rows))
        return original(trajectories, rows, *args, **kwargs)

    policy = make_policy(value_head=False)
    trajs = make_trajectories(policy, [[1.0, 0.0, 0.0, 1.0], [0.0, 1.0, 1.0, 1.0]])
    settings = make_settings(loss={"kl": "off"}, num_minibatches=2, micro_batch_size=8)
    opt, sched = adam(policy)
    monkeypatch.setattr(update_module, "micro_batches", spy)
    orders = []
    for _ in range(4):  # the same batch size every step, as in a run
        seen.clear()
        train_step(policy, None, opt, sched, trajs, settings)
        orders.append(tuple(map(tuple, seen)))
    assert len(set(orders)) > 1  # was: one fixed permutation for every step of equal size


# ----- fp16 loss scaling (item 2) -----------------------------------------------------------------
def _fp16_and_fp32_updates(**scaler_kwargs):
    """One SGD step of an fp16-compute and an fp32 policy (same weights) on advantages of 5e-5:
    gradients small enough that fp16 activations' gradients flush to zero unscaled."""
    deltas, stats = [], []
    for dtype in ("float16", "float32"):
        policy, _ = PolicyWithValueHead.from_config(
            ModelConfig(name_or_path="tiny-random", dtype=dtype, value_head=False), LoraConfig(), device="cpu", seed=0)
        trajs = make_trajectories(make_policy(value_head=False), [[1e-4, 0.0, 0.0, 1e-4]])
        scaler = make_grad_scaler(policy)
        assert (scaler is not None) == (dtype == "float16")
        if scaler is not None and scaler_kwargs:
            scaler = torch.amp.GradScaler("cpu", **scaler_kwargs)
        before = snapshot(policy)
        opt, sched = sgd(policy)
        stats.append(train_step(policy, None, opt, sched, trajs, make_settings(
            loss={"kl": "off"}, advantage={"estimator": "dr_grpo"}, max_grad_norm=1e9), scaler=scaler))
        deltas.append(weight_delta(policy, before))
    return deltas, stats


def test_fp16_compute_scales_the_loss_so_small_gradients_survive():
    (fp16, fp32), (stats, _) = _fp16_and_fp32_updates()
    assert stats["train/scaler_skipped_steps"] == 0.0
    for a, b in zip(fp16, fp32, strict=True):
        # Unscaled, 98.5% of these entries were exactly 0 in fp16 (21% nonzero in fp32: 1.5%).
        assert float((a != 0).float().mean()) >= 0.9 * float((b != 0).float().mean())
        assert float(torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0)) > 0.99 or b.abs().max() == 0


def test_an_fp16_overflow_skips_that_step_and_is_counted_not_raised():
    (fp16, _), (stats, _) = _fp16_and_fp32_updates(init_scale=2.0**120)  # overflows to inf
    assert stats["train/scaler_skipped_steps"] == 1.0 and stats["train/optimizer_steps"] == 0.0
    assert all(float(d.abs().max()) == 0.0 for d in fp16)
