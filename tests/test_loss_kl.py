"""The KL to the reference in grpo/algorithm/loss.py against hand-computed numbers (fp32, CPU,
atol 1e-6): the k1/k2/k3 estimators and their expected gradients, KL in the loss or in the reward,
and importance weights on the policy and KL terms."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import assert_close_to

from grpo.algorithm.config import ReferenceConfig
from grpo.algorithm.loss import (
    LossInputs,
    LossSettings,
    compute_policy_loss,
    kl_per_token,
    kl_reward_penalty,
)

NAN = float("nan")


def tensor(*rows, requires_grad: bool = False) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32, requires_grad=requires_grad)


# --- KL to the reference ---------------------------------------------------------------------


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_is_zero_when_policy_equals_reference(estimator):
    policy = torch.log_softmax(torch.randn(3, 5, generator=torch.Generator().manual_seed(0)), -1)
    assert torch.equal(kl_per_token(policy, policy.clone(), estimator), torch.zeros(3, 5))


def test_kl_estimators_on_a_hand_worked_example():
    # token 0: policy p = 0.5, ref q = 0.25 -> log_r = ln(q/p) = -ln 2 = -0.6931472
    # token 1: p = 0.25, q = 0.5           -> log_r = +ln 2
    # k1 = -log_r            = [ 0.6931472, -0.6931472]
    # k2 = log_r^2 / 2       = [ 0.2402265,  0.2402265]   (ln 2 squared = 0.4804530)
    # k3 = e^log_r - 1 - log_r = [0.5 - 1 + 0.6931472, 2 - 1 - 0.6931472] = [0.1931472, 0.3068528]
    policy = torch.log(tensor([0.5, 0.25]))
    ref = torch.log(tensor([0.25, 0.5]))
    assert_close_to(kl_per_token(policy, ref, "k1"), [[0.6931472, -0.6931472]])
    assert_close_to(kl_per_token(policy, ref, "k2"), [[0.2402265, 0.2402265]])
    assert_close_to(kl_per_token(policy, ref, "k3"), [[0.1931472, 0.3068528]])
    with pytest.raises(ValueError, match="k4"):
        kl_per_token(policy, ref, "k4")


def test_kl_in_loss_and_gradients_only_through_policy_logprobs():
    # policy = old (ratio 1) and A = 0, so the loss is only kl_coef * token_mean(k3):
    # 0.1 * (0.1931472 + 0.3068528) / 2 = 0.1 * 0.25 = 0.025 (the ln 2 terms cancel).
    # d k3 / d policy = 1 - e^(ref - policy) = [1 - 0.5, 1 - 2] = [0.5, -1]; times 0.1 / 2.
    policy = torch.log(tensor([0.5, 0.25])).requires_grad_()
    old = policy.detach().clone().requires_grad_()
    ref = torch.log(tensor([0.25, 0.5])).requires_grad_()
    advantages = tensor([0.0, 0.0]).requires_grad_()
    inputs = LossInputs(policy, old, advantages, torch.ones(1, 2), ref_logprobs=ref)
    settings = LossSettings(kl_coef=0.1, kl_estimator="k3")
    loss, metrics = compute_policy_loss(inputs, settings)
    assert_close_to(loss, 0.025)
    assert_close_to(metrics["kl_ref"], 0.25)
    grads = torch.autograd.grad(loss, [policy, old, ref, advantages], allow_unused=True)
    assert_close_to(grads[0], [[0.025, -0.05]])
    assert grads[1] is None and grads[2] is None and grads[3] is None


def test_kl_in_reward_removes_the_kl_term_from_the_loss():
    policy = torch.log(tensor([0.5, 0.25]))
    ref = torch.log(tensor([0.25, 0.5]))
    inputs = LossInputs(
        policy, policy.clone(), tensor([0.0, 0.0]), torch.ones(1, 2), ref_logprobs=ref
    )
    loss, metrics = compute_policy_loss(inputs, LossSettings(kl_coef=0.1, kl="reward"))
    assert loss.item() == 0.0
    assert "kl_loss" not in metrics
    assert_close_to(metrics["kl_ref"], 0.25)  # still reported
    # penalty = kl_coef * k1(old vs ref) = 0.1 * (ln 0.5 - ln 0.25) = 0.0693147 on the sampled
    # token; 0 on the masked-out one (whose NaN is ignored).
    old = torch.log(tensor([0.5, 0.25], [1.0, 1.0]))
    ref2 = torch.log(tensor([0.25, 0.5], [0.5, 1.0]))
    ref2[1, 1] = NAN
    penalty = kl_reward_penalty(old, ref2, tensor([1, 0], [1, 0]), kl_coef=0.1, estimator="k1")
    assert_close_to(penalty, [[0.0693147, 0.0], [0.0693147, 0.0]])
    assert not penalty.requires_grad


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_estimators_expected_gradients_on_a_categorical(estimator):
    """Over a 6-token categorical pi = softmax(theta), the expected gradient of each estimator as
    a loss term, sum_x pi(x) * d k(x) / d theta (tokens sampled from pi, not differentiated
    through), against the exact gradients of both KL directions (float64, all tokens summed)."""
    gen = torch.Generator().manual_seed(0)
    theta = torch.randn(6, generator=gen, dtype=torch.float64, requires_grad=True)
    ref = torch.log_softmax(torch.randn(6, generator=gen, dtype=torch.float64), -1)
    policy = torch.log_softmax(theta, -1)
    per_token = kl_per_token(policy.unsqueeze(0), ref.unsqueeze(0), estimator)[0]  # [6]
    (expected_grad,) = torch.autograd.grad((policy.detach().exp() * per_token).sum(), theta)

    def grad_of(kl):
        (grad,) = torch.autograd.grad(kl(torch.log_softmax(theta, -1)), theta)
        return grad

    reverse = grad_of(lambda lp: (lp.exp() * (lp - ref)).sum())  # d KL(pi || ref)
    forward = grad_of(lambda lp: (ref.exp() * (ref - lp)).sum())  # d KL(ref || pi)
    want = {"k1": torch.zeros(6, dtype=torch.float64), "k2": reverse, "k3": forward}[estimator]
    torch.testing.assert_close(expected_grad, want, atol=1e-12, rtol=0)
    assert reverse.abs().max() > 0.05 and (reverse - forward).abs().max() > 0.05  # they differ


def test_k1_in_the_loss_is_refused_and_allowed_in_the_reward():
    with pytest.raises(ValueError, match="k1 in the loss has zero expected gradient"):
        ReferenceConfig(kl="loss", kl_estimator="k1")
    assert LossSettings(kl="reward", kl_estimator="k1").kl_estimator == "k1"
    assert ReferenceConfig(kl="reward", kl_estimator="k1").kl_estimator == "k1"


def test_importance_weights_multiply_the_policy_and_kl_terms():
    # Tokens: r = 1.1, A = 2 -> -2.2 (w 0.5); r = 0.9, A = -1 -> 0.9 (w 2.0); a masked third.
    # policy = (0.5 * -2.2 + 2.0 * 0.9) / 2 = (-1.1 + 1.8) / 2 = 0.35
    # d/dlogp (w * -A r / 2) = [0.5 * -2.2 / 2, 2.0 * 0.9 / 2] = [-0.55, 0.9]
    # KL (k3, ref = old = 0, log_r = -ln r): [1/1.1 - 1 + ln 1.1, 1/0.9 - 1 + ln 0.9]
    #    = [0.0044011, 0.0057506]; weighted mean (0.5 * 0.0044011 + 2 * 0.0057506) / 2 = 0.0068509
    # The denominator stays 2 (the weights do not rescale it) and the masked NaN is ignored.
    policy = torch.tensor([[math.log(1.1), math.log(0.9), NAN]], requires_grad=True)
    inputs = LossInputs(policy, torch.zeros(1, 3), tensor([2.0, -1.0, 5.0]), tensor([1, 1, 0]),
                        ref_logprobs=torch.zeros(1, 3), is_weights=tensor([0.5, 2.0, NAN]))
    loss, metrics = compute_policy_loss(inputs, LossSettings(kl_coef=0.1))
    assert_close_to(metrics["policy_loss"], 0.35)
    assert_close_to(metrics["kl_loss"], 0.0068509)
    assert_close_to(metrics["kl_ref"], (0.0044011 + 0.0057506) / 2)  # the metric is unweighted
    assert_close_to(loss, 0.35 + 0.1 * 0.0068509)
    (grad,) = torch.autograd.grad(loss, policy)
    # plus the KL's: 0.1 * w * (1 - e^(ref - policy)) / 2 = 0.1 * [0.5 * 0.0909091, 2 * -0.1111111] / 2
    assert_close_to(grad, [[-0.55 + 0.0022727, 0.9 - 0.0111111, 0.0]])


def test_kl_in_loss_without_reference_is_an_error():
    inputs = LossInputs(torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2))
    with pytest.raises(ValueError, match="ref_logprobs"):
        compute_policy_loss(inputs, LossSettings(kl_coef=0.01))
