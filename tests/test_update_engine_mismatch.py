"""train_step against the engine's log-probs, on the tiny model with hand-built trajectories:
the mismatch figures, the step-0 check that refuses a mismatched engine, behaviour correction
(truncated or masked importance weights, sequence rejection, off), and nucleus sampling refused."""

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

from grpo.algorithm.batching import micro_batches
from grpo.algorithm.config import ReferenceConfig
from grpo.algorithm.correction import CorrectionSettings
from grpo.algorithm.reference import make_reference
from grpo.algorithm.update import LogprobMismatchError, UpdateSettings, train_step
from grpo.config import load_config


def _shift_engine(trajs, shift: float) -> None:
    """The engine reports every sampled token's log-prob `shift` nats higher than it is."""
    for t in trajs:
        t.behavior_logprobs = [lp + shift if m else lp for lp, m in zip(t.behavior_logprobs, t.loss_mask)]


@pytest.mark.parametrize("check", [False, True])
def test_mismatch_distribution_reports_mean_median_p99_and_max(check):
    """Engine log-probs offset by 0.01 on every sampled token but one, which is off by 0.3:
    the no-grad pass (step-0 check) and the first forward (no pass) report the same figures."""
    policy = make_policy(value_head=False)
    trajs = make_trajectories(policy, [[1.0, 0.0], [0.0, 1.0]])
    first = True
    for t in trajs:
        shifted = []
        for lp, m in zip(t.behavior_logprobs, t.loss_mask):
            offset = (0.3 if first else 0.01) if m else 0.0
            first = first and not m
            shifted.append(lp + offset)
        t.behavior_logprobs = shifted
    n = sum(sum(t.loss_mask[1:]) for t in trajs)
    opt, sched = adam(policy)
    stats = train_step(policy, None, opt, sched, trajs, make_settings(loss={"kl": "off"}),
                       check_logprobs=check)
    assert stats["train/logprob_mismatch"] == pytest.approx((0.3 + 0.01 * (n - 1)) / n, abs=1e-5)
    assert stats["train/logprob_mismatch_p50"] == pytest.approx(0.01, abs=1e-5)
    assert stats["train/logprob_mismatch_max"] == pytest.approx(0.3, abs=1e-5)
    # p99 interpolates between the two largest of n values: 0.01 + frac * 0.29
    frac = 0.99 * (n - 1) - math.floor(0.99 * (n - 1))
    assert stats["train/logprob_mismatch_p99"] == pytest.approx(0.01 + frac * 0.29, abs=1e-4)


def test_step0_check_refuses_mismatched_engine_logprobs_and_leaves_weights_alone():
    policy = make_policy(value_head=False)
    trajs = make_trajectories(policy, [[1.0, 0.0]])
    for t in trajs:
        t.behavior_logprobs = [lp - 0.5 if m else 0.0 for lp, m in zip(t.behavior_logprobs, t.loss_mask)]
    before = snapshot(policy)
    opt, sched = adam(policy)
    with pytest.raises(LogprobMismatchError, match=r"mean \|trainer - engine\| log-prob .* 0\.5000"):
        train_step(policy, None, opt, sched, trajs, make_settings(loss={"kl": "off"}), check_logprobs=True)
    assert all(torch.equal(a, b) for a, b in zip(before, snapshot(policy)))


# ----- behaviour correction (issue 14, item 1) --------------------------------------------------
def _update_with_engine_shift(shift: float, correction=None):
    """The weight change of one SGD step (lr 1, no clipping) on a fixed batch whose engine
    log-probs are off by `shift` nats, and the step's stats."""
    policy = make_policy(value_head=False)
    trajs = make_trajectories(policy, [[1.0, 0.0, 0.0, 1.0], [0.0, 1.0, 0.5, 1.0]])
    _shift_engine(trajs, shift)
    before = snapshot(policy)
    opt, sched = sgd(policy)
    stats = train_step(policy, None, opt, sched, trajs,
                       make_settings(loss={"kl": "off"}, correction=correction, max_grad_norm=1e9))
    return weight_delta(policy, before), stats


@pytest.mark.parametrize(("shift", "correction", "factor"), [
    (0.3, None, math.exp(-0.3)),  # default tis: rho = e^-0.3 on every token, k3 0.041 < 0.05
    (-0.25, None, math.exp(0.25)),  # rho = e^0.25 = 1.28 < C = 2, k3 0.034
    (-0.8, {"max_sequence_kl": None}, 2.0),  # rho = 2.23 truncated to C = 2
    (-0.8, {"mode": "mis", "max_sequence_kl": None}, 0.0),  # rho > C: every token masked
    (-0.8, None, 0.0),  # default: k3 = 0.43 per token > 0.05, every sequence rejected
    (0.7, {"mode": "off"}, 1.0),  # off: the engine's log-probs do not enter the update
])
def test_shifted_engine_logprobs_change_the_update_exactly_as_predicted(shift, correction, factor):
    """Every token gets the same weight w, so the SGD update is w times the exact engine's."""
    exact, _ = _update_with_engine_shift(0.0)
    shifted, stats = _update_with_engine_shift(shift, correction)
    assert max(float(d.abs().max()) for d in exact) > 1e-3
    for a, b in zip(shifted, exact, strict=True):
        # atol: a few ulps of the weights themselves (a delta is a difference of two weights).
        torch.testing.assert_close(a, factor * b, atol=3e-7, rtol=1e-5)
    assert stats["train/mismatch_kl"] == pytest.approx(math.exp(-shift) - 1 + shift, rel=1e-4)
    if correction != {"mode": "off"}:
        weight = 0.0 if factor == 0 else min(math.exp(-shift), 2.0)
        assert stats["train/is_weight_mean"] == pytest.approx(weight, rel=1e-5)
        assert stats["train/is_clip_frac"] == (1.0 if math.exp(-shift) > 2 else 0.0)
        assert stats["train/is_rejected_frac"] == (1.0 if correction is None and shift == -0.8 else 0.0)


def test_correction_off_reproduces_the_uncorrected_update_bit_for_bit():
    """`off` ignores the engine's log-probs bit for bit; and with an engine that reports exactly
    the trainer's log-probs, `tis` (every weight exactly 1) gives the same bits as `off`."""
    results = {}
    for name, shift, mode in [("off", 0.0, "off"), ("off_shifted", 0.7, "off"), ("tis_exact", 0.0, "tis")]:
        policy = make_policy(value_head=False)
        reference = make_reference(policy, ReferenceConfig(ema_decay=1.0))
        drift(policy, 0.02)
        trajs = make_trajectories(policy, [[1.0, 0.0, 0.0, 1.0], [0.0, 1.0, 0.5, 1.0]])
        settings = make_settings(loss={"kl_coef": 0.1}, correction={"mode": mode}, micro_batch_size=8)
        if mode == "tis":  # the engine reports what the training forward will compute, bit for bit
            (mb,) = micro_batches(trajs, list(range(8)), 8, 0, "cpu")
            with torch.no_grad():
                lp = policy(mb.input_ids, mb.attention_mask, positions=mb.loss_mask).logprobs
            for r, i in enumerate(mb.index.tolist()):
                row = lp[r, : len(trajs[i].token_ids) - 1].tolist()
                trajs[i].behavior_logprobs = [0.0] + [v if m else 0.0 for v, m in zip(row, trajs[i].loss_mask[1:])]
        _shift_engine(trajs, shift)
        opt, sched = adam(policy)
        stats = train_step(policy, reference, opt, sched, trajs, settings)
        results[name] = (snapshot(policy), stats["train/loss"])
        if mode == "tis":
            assert stats["train/is_weight_mean"] == 1.0 and stats["train/mismatch_kl"] == 0.0
    for name in ("off_shifted", "tis_exact"):
        assert results[name][1] == results["off"][1]
        assert all(torch.equal(a, b) for a, b in zip(results[name][0], results["off"][0], strict=True))


# ----- nucleus sampling (item 7) ------------------------------------------------------------------
def test_nucleus_sampling_is_refused_for_training():
    with pytest.raises(ValueError, match=r"rollout.top_p=0.9 < 1.*rollout.top_p: 1.0"):
        UpdateSettings.from_config(load_config(None, ["rollout.top_p=0.9"]))
    settings = UpdateSettings.from_config(load_config(None, []))
    assert settings.correction == CorrectionSettings("tis", 2.0, 0.05)
