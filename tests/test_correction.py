"""grpo/algorithm/correction.py against hand-computed numbers (fp32, CPU, atol 1e-6).

Log-probs are chosen so that rho = pi_old / pi_behavior is a round number: behavior 0, old ln rho.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import assert_close_to

from grpo.algorithm.config import AlgorithmConfig, BehaviorCorrectionConfig
from grpo.algorithm.correction import CorrectionSettings, behavior_weights, correction_stats
from grpo.config import load_config

NAN = float("nan")

# Row 0: rho = 0.5, 1, 3 (+ a masked NaN); row 1: rho = 1.2, 0.9; row 2: nothing sampled.
# k3 = rho - 1 - ln rho:  0.5 -> 0.1931472, 1 -> 0, 3 -> 2 - 1.0986123 = 0.9013877,
#                         1.2 -> 0.2 - 0.1823216 = 0.0176784, 0.9 -> -0.1 + 0.1053605 = 0.0053605
# Sequence means: row 0 (0.1931472 + 0 + 0.9013877) / 3 = 0.3648450; row 1 0.0115195.
RHO = [[0.5, 1.0, 3.0, NAN], [1.2, 0.9, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]]
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)
OLD = torch.tensor([[NAN if math.isnan(r) else math.log(r) for r in row] for row in RHO])
BEHAVIOR = torch.zeros(3, 4)
K3 = [[0.1931472, 0.0, 0.9013877, 0.0], [0.0176784, 0.0053605, 0.0, 0.0], [0.0] * 4]


def weights(**settings):
    return behavior_weights(OLD, BEHAVIOR, MASK, CorrectionSettings(**settings))


def test_tis_truncates_at_c_and_rejects_sequences_past_the_kl_bound():
    out = weights(mode="tis", clip=2.0, max_sequence_kl=0.1)
    assert_close_to(out.mismatch_kl, K3)
    assert out.clipped.tolist() == [[False, False, True, False], [False] * 4, [False] * 4]
    assert out.rejected.tolist() == [True, False, False]  # 0.365 > 0.1 >= 0.0115; row 2 is empty
    assert_close_to(out.weights, [[0.0] * 4, [1.2, 0.9, 0.0, 0.0], [0.0] * 4])
    assert not out.weights.requires_grad


def test_tis_without_a_sequence_bound_and_mis_mask_above_c():
    assert_close_to(weights(mode="tis", max_sequence_kl=None).weights,
                    [[0.5, 1.0, 2.0, 0.0], [1.2, 0.9, 0.0, 0.0], [0.0] * 4])
    assert_close_to(weights(mode="mis", max_sequence_kl=None).weights,
                    [[0.5, 1.0, 0.0, 0.0], [1.2, 0.9, 0.0, 0.0], [0.0] * 4])
    # C = 1: the weight never exceeds 1 (tis) / tokens the trainer likes more are dropped (mis).
    assert_close_to(weights(mode="tis", clip=1.0, max_sequence_kl=None).weights[1], [1.0, 0.9, 0.0, 0.0])
    assert_close_to(weights(mode="mis", clip=1.0, max_sequence_kl=None).weights[1], [0.0, 0.9, 0.0, 0.0])


def test_off_gives_no_weights_but_still_measures_the_mismatch():
    out = weights(mode="off")
    assert out.weights is None
    assert_close_to(out.mismatch_kl, K3)
    assert not out.rejected.any()


def test_an_extreme_log_ratio_gives_a_finite_weight():
    out = behavior_weights(torch.tensor([[0.0, 0.0]]), torch.tensor([[-80.0, 80.0]]),
                           torch.ones(1, 2, dtype=torch.bool), CorrectionSettings(max_sequence_kl=None))
    assert_close_to(out.weights, [[2.0, math.exp(-20.0)]])
    assert torch.isfinite(out.mismatch_kl).all()


def test_step_metrics_over_micro_batches():
    # Split rows {0} and {1, 2} into two micro-batches of different widths.
    first = behavior_weights(OLD[:1], BEHAVIOR[:1], MASK[:1], CorrectionSettings(max_sequence_kl=0.1))
    second = behavior_weights(OLD[1:, :2], BEHAVIOR[1:, :2], MASK[1:, :2], CorrectionSettings(max_sequence_kl=0.1))
    stats = correction_stats([first, second], [MASK[:1], MASK[1:, :2]])
    sampled = sorted([0.1931472, 0.0, 0.9013877, 0.0176784, 0.0053605])
    assert stats["train/mismatch_kl"] == pytest.approx(sum(sampled) / 5, abs=1e-6)
    # p99 of 5 values: position 0.99 * 4 = 3.96 between the two largest.
    assert stats["train/mismatch_kl_p99"] == pytest.approx(sampled[3] + 0.96 * (sampled[4] - sampled[3]), abs=1e-6)
    assert stats["train/is_weight_mean"] == pytest.approx((1.2 + 0.9) / 5, abs=1e-6)
    assert stats["train/is_clip_frac"] == pytest.approx(1 / 5)
    assert stats["train/is_rejected_frac"] == pytest.approx(1 / 2)  # of the 2 rows that sampled
    off = correction_stats([behavior_weights(OLD, BEHAVIOR, MASK, CorrectionSettings(mode="off"))], [MASK])
    assert set(off) == {"train/mismatch_kl", "train/mismatch_kl_p99"}


def test_config_section_shorthand_and_errors():
    assert AlgorithmConfig().behavior_correction.mode == "tis"  # on by default
    assert AlgorithmConfig(behavior_correction="mis").behavior_correction.mode == "mis"
    assert AlgorithmConfig(behavior_correction=False).behavior_correction.mode == "off"  # YAML `off`
    config = AlgorithmConfig(behavior_correction={"mode": "tis", "clip": 3.0, "max_sequence_kl": None})
    assert CorrectionSettings.from_config(config.behavior_correction) == CorrectionSettings("tis", 3.0, None)
    with pytest.raises(ValueError, match="'off', 'tis' or 'mis'"):
        AlgorithmConfig(behavior_correction="always")
    with pytest.raises(ValueError, match="clip\n  Input should be greater than or equal to 1"):
        BehaviorCorrectionConfig(clip=0.5)  # checked once, by the section the settings come from
    with pytest.raises(ValueError, match="behavior_correction 'always' is unknown"):
        behavior_weights(OLD, BEHAVIOR, MASK, CorrectionSettings(mode="always"))


def test_yaml_off_spellings_parse(tmp_path):
    """YAML 1.1 reads a bare `off` as false; both sections take it as the option 'off'."""
    path = tmp_path / "run.yaml"
    path.write_text("algorithm:\n  behavior_correction: off\n  reference: {kl: off}\n")
    config = load_config(str(path), [])
    assert (config.algorithm.behavior_correction.mode, config.algorithm.reference.kl) == ("off", "off")
    override = load_config(None, ["algorithm.behavior_correction=off", "algorithm.reference.kl=off"])
    assert (override.algorithm.behavior_correction.mode, override.algorithm.reference.kl) == ("off", "off")
    assert load_config(None, ["algorithm.behavior_correction.mode=mis"]).algorithm.behavior_correction.mode == "mis"
