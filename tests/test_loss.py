"""grpo/algorithm/loss.py against hand-computed numbers (fp32, CPU, atol 1e-6): the PPO clipped
surrogate, masks, value loss and entropy, aggregation over micro-batches, and the settings.

The KL to the reference (estimators, in the loss or in the reward): tests/test_loss_kl.py."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import assert_close_to

from grpo.algorithm.config import AlgorithmConfig, LossConfig, ReferenceConfig
from grpo.algorithm.loss import (
    LossInputs,
    LossSettings,
    aggregate_loss,
    compute_policy_loss,
    loss_denominator,
    ppo_token_loss,
    value_token_loss,
)

NAN = float("nan")


def tensor(*rows, requires_grad: bool = False) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32, requires_grad=requires_grad)


def log_ratios(*ratios: float) -> torch.Tensor:
    """policy_logprobs [1, T] for old_logprobs = 0, so that exp(policy - old) = ratio."""
    return torch.tensor([[math.log(r) for r in ratios]], requires_grad=True)


ONLY_PG = LossSettings(kl="off")


def policy_grad(policy: torch.Tensor, advantages: torch.Tensor, settings: LossSettings):
    old = torch.zeros_like(policy)
    mask = torch.ones_like(policy)
    loss, metrics = compute_policy_loss(LossInputs(policy, old, advantages, mask), settings)
    (grad,) = torch.autograd.grad(loss, policy)
    return loss, metrics, grad


# --- PPO clipped surrogate -------------------------------------------------------------------


def test_unclipped_ratio_inside_the_clip_range():
    # r = 1.1, A = 2 -> -A r = -2.2;  r = 0.9, A = -1 -> -A r = 0.9 (both inside [0.8, 1.2]).
    policy = log_ratios(1.1, 0.9)
    advantages = tensor([2.0, -1.0])
    terms = ppo_token_loss(policy, torch.zeros(1, 2), advantages, torch.ones(1, 2), 0.2, 0.2)
    assert_close_to(terms.loss, [[-2.2, 0.9]])
    loss, metrics, grad = policy_grad(policy, advantages, ONLY_PG)
    # token_mean: (-2.2 + 0.9) / 2 = -0.65; d/dlogp (-A r / 2) = -A r / 2 = [-1.1, 0.45]
    assert_close_to(loss, -0.65)
    assert_close_to(grad, [[-1.1, 0.45]])
    assert_close_to(metrics["ratio_mean"], 1.0)  # (1.1 + 0.9) / 2
    assert_close_to(metrics["ratio_std"], 0.1)  # population std of {1.1, 0.9}
    assert_close_to(metrics["clip_frac_low"], 0.0)
    assert_close_to(metrics["clip_frac_high"], 0.0)
    # Tokens come from old, so KL(old || policy) = E_old[r - 1 - ln r] (k3 with the ratio r):
    # 1.1 - 1 - ln 1.1 = 0.0046898, 0.9 - 1 - ln 0.9 = 0.0053605, mean 0.0050252.
    # (The old metric had the ratio the wrong way round: 1/r - 1 + ln r, mean 0.0050758.)
    assert_close_to(metrics["approx_kl_old"], 0.0050251670)


def test_clipped_with_positive_advantage():
    # A = 2: r = 1.5 -> max(-3.0, -2 * 1.2) = -2.4 (clipped high, no gradient);
    #        r = 0.5 -> max(-1.0, -2 * 0.8) = -1.0 (the low clip never binds for A > 0).
    policy = log_ratios(1.5, 0.5)
    advantages = tensor([2.0, 2.0])
    loss, metrics, grad = policy_grad(policy, advantages, ONLY_PG)
    assert_close_to(loss, (-2.4 - 1.0) / 2)
    assert_close_to(grad, [[0.0, -2.0 * 0.5 / 2]])  # d(-A r)/dlogp = -A r, over 2 tokens
    assert_close_to(metrics["clip_frac_high"], 0.5)
    assert_close_to(metrics["clip_frac_low"], 0.0)


def test_clipped_with_negative_advantage():
    # A = -1: r = 0.5 -> max(0.5, 0.8) = 0.8 (clipped low, no gradient);
    #         r = 1.5 -> max(1.5, 1.2) = 1.5 (unclipped: the pessimistic bound keeps the larger).
    policy = log_ratios(0.5, 1.5)
    advantages = tensor([-1.0, -1.0])
    loss, metrics, grad = policy_grad(policy, advantages, ONLY_PG)
    assert_close_to(loss, (0.8 + 1.5) / 2)
    assert_close_to(grad, [[0.0, 1.5 / 2]])
    assert_close_to(metrics["clip_frac_low"], 0.5)
    assert_close_to(metrics["clip_frac_high"], 0.0)


def test_asymmetric_clip_higher():
    # clip_low 0.2, clip_high 0.28: range [0.8, 1.28].
    # r = 1.25, A = 1 -> -1.25 (a symmetric 0.2 clip would give -1.2)
    # r = 1.40, A = 1 -> -1.28
    # r = 0.70, A = -1 -> max(0.7, 0.8) = 0.8
    policy = log_ratios(1.25, 1.4, 0.7)
    advantages = tensor([1.0, 1.0, -1.0])
    terms = ppo_token_loss(policy, torch.zeros(1, 3), advantages, torch.ones(1, 3), 0.2, 0.28)
    assert_close_to(terms.loss, [[-1.25, -1.28, 0.8]])
    assert terms.clipped_high.tolist() == [[False, True, False]]
    assert terms.clipped_low.tolist() == [[False, False, True]]
    symmetric = ppo_token_loss(policy, torch.zeros(1, 3), advantages, torch.ones(1, 3), 0.2, 0.2)
    assert_close_to(symmetric.loss, [[-1.2, -1.2, 0.8]])


def test_dual_clip_bounds_negative_advantage_loss():
    # c = 3. r = 4, A = -1: PPO gives max(4, 1.2) = 4, dual-clip min(4, -c A = 3) = 3 (no grad).
    #        r = 2, A = -1: max(2, 1.2) = 2 < 3 -> 2 (grad -A r = 2).
    #        r = 4, A = +1: max(-4, -1.2) = -1.2; dual-clip leaves A > 0 alone.
    policy = log_ratios(4.0, 2.0, 4.0)
    advantages = tensor([-1.0, -1.0, 1.0])
    loss, metrics, grad = policy_grad(policy, advantages, LossSettings(kl="off", dual_clip=3.0))
    assert_close_to(loss, (3.0 + 2.0 - 1.2) / 3)
    assert_close_to(grad, [[0.0, 2.0 / 3, 0.0]])
    assert_close_to(metrics["dual_clip_frac"], 1 / 3)
    without, _, _ = policy_grad(policy, advantages, ONLY_PG)
    assert_close_to(without, (4.0 + 2.0 - 1.2) / 3)


def test_sequence_advantages_broadcast_like_token_advantages():
    policy = torch.tensor([[-0.1, -0.5, -1.0], [-2.0, -0.3, -0.7]])
    old = torch.tensor([[-0.2, -0.4, -1.3], [-1.5, -0.3, -0.9]])
    mask = tensor([1, 1, 0], [1, 1, 1])
    per_seq = tensor(1.5, -0.5)
    per_token = per_seq.unsqueeze(-1).expand(2, 3)
    loss_seq, _ = compute_policy_loss(LossInputs(policy, old, per_seq, mask), ONLY_PG)
    loss_tok, _ = compute_policy_loss(LossInputs(policy, old, per_token, mask), ONLY_PG)
    assert_close_to(loss_seq, loss_tok.item())


# --- masks ---------------------------------------------------------------------------------------


def test_fully_masked_row_contributes_nothing_even_with_nan_padding():
    # Row 0: r = 1.1, A = 2 -> -2.2 (one token). Row 1: fully masked, its tensors hold NaN.
    policy = torch.tensor([[math.log(1.1)], [NAN]], requires_grad=True)
    old = tensor([0.0], [NAN])
    advantages = tensor(2.0, NAN)
    mask = tensor([1.0], [0.0])
    for agg in ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"):
        settings = LossSettings(kl="off", loss_agg=agg, norm_length=1.0)
        loss, metrics = compute_policy_loss(LossInputs(policy, old, advantages, mask), settings)
        (grad,) = torch.autograd.grad(loss, policy)
        # every mode divides by 1 here: 1 token, 1 non-empty sequence, L = 1
        assert_close_to(loss, -2.2)
        assert_close_to(grad, [[-2.2], [0.0]])
        assert_close_to(metrics["ratio_mean"], 1.1)
        assert_close_to(metrics["num_tokens"], 1.0)


def test_fully_masked_batch_is_zero_and_finite():
    policy = torch.full((2, 3), NAN, requires_grad=True)
    values = torch.full((2, 3), NAN, requires_grad=True)
    nan = torch.full((2, 3), NAN)
    inputs = LossInputs(
        policy_logprobs=policy,
        old_logprobs=nan,
        advantages=nan,
        loss_mask=torch.zeros(2, 3),
        ref_logprobs=nan,
        entropy=nan,
        values=values,
        old_values=nan,
        returns=nan,
    )
    settings = LossSettings(kl_coef=0.1, entropy_coef=0.01, dual_clip=3.0)
    loss, metrics = compute_policy_loss(inputs, settings)
    policy_grad, value_grad = torch.autograd.grad(loss, [policy, values])
    assert loss.item() == 0.0
    assert torch.equal(policy_grad, torch.zeros(2, 3))
    assert torch.equal(value_grad, torch.zeros(2, 3))
    expected_keys = {
        *("loss", "policy_loss", "ratio_mean", "ratio_std", "clip_frac_low", "clip_frac_high"),
        *("dual_clip_frac", "approx_kl_old", "kl_ref", "kl_loss", "entropy", "entropy_loss"),
        *("value_loss", "value_clip_frac", "num_tokens"),
    }
    assert set(metrics) == expected_keys
    for name, value in metrics.items():
        assert value.item() == 0.0, name
        assert not value.requires_grad, name


# --- value loss and entropy ------------------------------------------------------------------


def test_value_clipping():
    # eps = 0.2, V_old = 1:
    # tok 0: V 1.5, R 2 -> unclipped (1.5-2)^2 = 0.25, clipped V 1.2: (1.2-2)^2 = 0.64
    #        -> 0.5 * 0.64 = 0.32 (the clipped branch: no gradient)
    # tok 1: V 1.5, R 1 -> unclipped 0.25, clipped (1.2-1)^2 = 0.04 -> 0.5*0.25 = 0.125
    # tok 2: V 0.9, R 0 -> inside the range, 0.9^2 = 0.81 -> 0.405
    values = tensor([1.5, 1.5, 0.9], requires_grad=True)
    old_values = tensor([1.0, 1.0, 1.0])
    returns = tensor([2.0, 1.0, 0.0])
    per_token, clipped = value_token_loss(values, returns, old_values, value_clip=0.2)
    assert_close_to(per_token, [[0.32, 0.125, 0.405]])
    assert clipped.tolist() == [[True, False, False]]
    unclipped, _ = value_token_loss(values, returns)
    assert_close_to(unclipped, [[0.125, 0.125, 0.405]])

    # In the loss: value_coef 0.5 * token mean (0.32 + 0.125 + 0.405) / 3 = 0.5 * 0.2833333
    # d/dV = 0.5 / 3 * (V - R) where unclipped: [0 (clipped), 0.5 / 3 * 0.5, 0.5 / 3 * 0.9]
    zeros = torch.zeros(1, 3)
    inputs = LossInputs(
        zeros, zeros, zeros, torch.ones(1, 3), values=values, old_values=old_values, returns=returns
    )
    loss, metrics = compute_policy_loss(
        inputs, LossSettings(kl="off", value_coef=0.5, value_clip=0.2)
    )
    assert_close_to(loss, 0.5 * 0.85 / 3)
    assert_close_to(metrics["value_loss"], 0.85 / 3)
    assert_close_to(metrics["value_clip_frac"], 1 / 3)
    (grad,) = torch.autograd.grad(loss, values)
    assert_close_to(grad, [[0.0, 0.5 / 3 * 0.5, 0.5 / 3 * 0.9]])


def test_entropy_bonus_is_subtracted():
    # entropy_coef 0.01, token-mean entropy (1 + 2) / 2 = 1.5 -> loss = -0.015; the masked-out
    # token's entropy (100) is ignored. d loss / d entropy = -0.01 / 2 on sampled tokens.
    entropy = tensor([1.0, 2.0, 100.0], requires_grad=True)
    zeros = torch.zeros(1, 3)
    inputs = LossInputs(zeros, zeros, zeros, tensor([1, 1, 0]), entropy=entropy)
    loss, metrics = compute_policy_loss(inputs, LossSettings(kl="off", entropy_coef=0.01))
    assert_close_to(loss, -0.015)
    assert_close_to(metrics["entropy"], 1.5)
    (grad,) = torch.autograd.grad(loss, entropy)
    assert_close_to(grad, [[-0.005, -0.005, 0.0]])
    with pytest.raises(ValueError, match="entropy"):
        compute_policy_loss(
            LossInputs(zeros, zeros, zeros, tensor([1, 1, 0])),
            LossSettings(kl="off", entropy_coef=0.01),
        )


# --- aggregation -----------------------------------------------------------------------------

# Per-token values and mask: row 0 has 4 tokens, row 1 has 2, row 2 none (padding holds NaN).
AGG_VALUES = tensor([1, 2, 3, 4], [5, 6, NAN, NAN], [NAN, NAN, NAN, NAN])
AGG_MASK = tensor([1, 1, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0])


def test_token_mean_denominator():
    # 6 unmasked tokens; (1 + 2 + 3 + 4 + 5 + 6) / 6 = 21 / 6 = 3.5
    assert loss_denominator(AGG_MASK, "token_mean") == 6.0
    assert_close_to(aggregate_loss(AGG_VALUES, AGG_MASK, "token_mean"), 3.5)


def test_seq_mean_token_mean_denominator():
    # 2 non-empty sequences (row 2 excluded); row means 10/4 = 2.5 and 11/2 = 5.5 -> 8 / 2 = 4.0
    assert loss_denominator(AGG_MASK, "seq_mean_token_mean") == 2.0
    assert_close_to(aggregate_loss(AGG_VALUES, AGG_MASK, "seq_mean_token_mean"), 4.0)


def test_seq_mean_token_sum_norm_denominator():
    # Dr. GRPO, L = 8: row sums 10 and 11, each / 8, then / 2 sequences = 21 / 16 = 1.3125
    assert loss_denominator(AGG_MASK, "seq_mean_token_sum_norm") == 2.0
    assert_close_to(aggregate_loss(AGG_VALUES, AGG_MASK, "seq_mean_token_sum_norm", norm_length=8), 1.3125)
    with pytest.raises(ValueError, match="norm_length"):
        aggregate_loss(AGG_VALUES, AGG_MASK, "seq_mean_token_sum_norm")


def test_denominator_over_micro_batches_of_different_widths():
    masks = [tensor([1, 1, 1], [0, 0, 0]), tensor([1, 0], [1, 1], [0, 1])]
    assert loss_denominator(masks, "token_mean") == 7.0  # 3 + 0 + 1 + 2 + 1
    assert loss_denominator(masks, "seq_mean_token_mean") == 4.0  # the empty row does not count
    with pytest.raises(ValueError, match="token_sum"):
        loss_denominator(masks, "token_sum")


def _random_inputs(batch: int, length: int, seed: int) -> tuple[LossInputs, list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    lengths = [5, 2, 7, 0, 3][:batch]
    mask = torch.zeros(batch, length)
    for row, n in enumerate(lengths):
        mask[row, length - 1 - n : length - 1] = 1  # a prompt before, one padding token after

    def rand(scale: float = 1.0) -> torch.Tensor:
        return scale * torch.randn(batch, length, generator=gen)

    leaves = [
        (rand(0.3) - 1.0).requires_grad_(),
        rand().requires_grad_(),
        rand().abs().requires_grad_(),
    ]
    policy, values, entropy = leaves
    inputs = LossInputs(
        policy_logprobs=policy,
        old_logprobs=policy.detach() + rand(0.3),
        advantages=rand(),
        loss_mask=mask,
        ref_logprobs=policy.detach() + rand(0.2),
        entropy=entropy,
        values=values,
        old_values=values.detach() + rand(0.3),
        returns=rand(),
        is_weights=rand().abs(),
    )
    return inputs, leaves


def _slice(inputs: LossInputs, rows: slice, width: int) -> LossInputs:
    fields = {name: getattr(inputs, name) for name in inputs.__dataclass_fields__}
    return LossInputs(**{name: value[rows, -width:] for name, value in fields.items()})


@pytest.mark.parametrize(
    "loss_agg", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]
)
def test_micro_batch_losses_sum_to_the_full_minibatch_loss(loss_agg):
    settings = LossSettings(
        clip_low=0.2,
        clip_high=0.28,
        dual_clip=3.0,
        kl_coef=0.05,
        value_coef=0.5,
        value_clip=0.2,
        entropy_coef=0.01,
        loss_agg=loss_agg,
        norm_length=9.0,
    )
    inputs, leaves = _random_inputs(batch=5, length=9, seed=1)
    full_loss, _ = compute_policy_loss(inputs, settings)
    full_grads = torch.autograd.grad(full_loss, leaves)

    # Two micro-batches, each cut to its own width (rows 0-1 need 6 columns, rows 2-4 need 8).
    micro = [_slice(inputs, slice(0, 2), 6), _slice(inputs, slice(2, 5), 8)]
    denominator = loss_denominator([m.loss_mask for m in micro], loss_agg)
    assert denominator == loss_denominator(inputs.loss_mask, loss_agg)
    micro_losses = [compute_policy_loss(m, settings, denominator)[0] for m in micro]
    summed = micro_losses[0] + micro_losses[1]
    assert_close_to(summed, full_loss.item())
    for full_grad, micro_grad in zip(full_grads, torch.autograd.grad(summed, leaves)):
        assert_close_to(micro_grad, full_grad)

    # Each micro-batch dividing by its own count would give a different (wrong) loss.
    own = sum(compute_policy_loss(m, settings)[0] for m in micro)
    assert abs(own.item() - full_loss.item()) > 1e-3


# --- settings --------------------------------------------------------------------------------


def test_settings_from_config_and_validation():
    # Every loss field of the algorithm config's sections, each set away from its default.
    loss = {"clip_low": 0.1, "clip_high": 0.28, "dual_clip": 3.0, "value_coef": 0.25,
            "value_clip": None, "entropy_coef": 0.001, "loss_agg": "seq_mean_token_sum_norm"}
    reference = {"kl": "reward", "kl_coef": 0.05, "kl_estimator": "k2"}
    algorithm = AlgorithmConfig(loss=loss, reference=reference)
    settings = LossSettings.from_config(algorithm, norm_length=512)
    assert settings == LossSettings(**loss, **reference, norm_length=512)
    assert not settings.kl_in_loss
    assert LossSettings().kl_in_loss and LossSettings().kl_coef == 0.01
    assert not LossSettings(kl="off").kl_in_loss
    # The values are checked once, by the config sections the settings are built from.
    with pytest.raises(ValueError, match="loss_agg\n  Input should be 'token_mean'"):
        LossConfig(loss_agg="token_sum")
    with pytest.raises(ValueError, match="dual_clip\n  Input should be greater than 1"):
        LossConfig(dual_clip=1.0)
    with pytest.raises(ValueError, match="kl_coef\n  Input should be greater than 0"):
        ReferenceConfig(kl="loss", kl_coef=0.0)
    with pytest.raises(ValueError, match="kl\n  Input should be 'off', 'loss' or 'reward'"):
        ReferenceConfig(kl="sometimes")


def test_shape_mismatch_names_the_tensor():
    inputs = LossInputs(torch.zeros(2, 3), torch.zeros(2, 4), torch.zeros(2), torch.ones(2, 3))
    with pytest.raises(ValueError, match="old_logprobs"):
        compute_policy_loss(inputs, ONLY_PG)
