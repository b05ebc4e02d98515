"""The EMA reference: hand-computed EMA arithmetic, the LoRA and full-copy kinds, checkpoints."""

from __future__ import annotations

import collections
import contextlib

import pytest
import torch

from grpo.algorithm.config import ReferenceConfig
from grpo.algorithm.reference import (
    FullCopyEMAReference,
    LoraEMAReference,
    ema_update_,
    make_reference,
)
from grpo.algorithm.scoring import score
from grpo.models.config import LoraConfig, ModelConfig
from grpo.models.peft_weights import lm_tensors
from grpo.models.policy import PolicyWithValueHead
from grpo.models.source import build_tiny_model
from grpo.trajectory import Trajectory

TINY = ModelConfig(name_or_path="tiny-random", dtype="float32")
Q_PROJ = "base_model.model.model.layers.0.self_attn.q_proj"


def _policy(lora: bool, dropout: float = 0.0) -> PolicyWithValueHead:
    policy, _ = PolicyWithValueHead.from_config(
        TINY, LoraConfig(enabled=lora, dropout=dropout), "cpu", seed=0
    )
    return policy


def _randomize(policy: PolicyWithValueHead, seed: int, only: str | None = None) -> None:
    """Move the trainable LM weights (adapters for LoRA) to new random values."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if p.requires_grad and (only is None or only in name):
                p.add_(torch.randn(p.shape, generator=gen) * 0.05)


def _batch():
    gen = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, 2000, (2, 10), generator=gen)  # [B, T]
    return input_ids, torch.ones_like(input_ids)


def _policy_logprobs(policy, temperature=1.0):
    with torch.no_grad():
        return policy(*_batch(), temperature=temperature).logprobs  # [B, T-1]


# ----- the EMA arithmetic ------------------------------------------------------------------------


def test_ema_update_hand_numbers():
    ref = [torch.tensor([1.0, 2.0, -4.0])]
    policy = [torch.tensor([3.0, 6.0, 0.0])]
    ema_update_(ref, policy, decay=0.75)
    # 0.75 * 1 + 0.25 * 3 = 1.5;  0.75 * 2 + 0.25 * 6 = 3.0;  0.75 * -4 + 0.25 * 0 = -3.0
    torch.testing.assert_close(ref[0], torch.tensor([1.5, 3.0, -3.0]), atol=1e-7, rtol=0)
    ema_update_(ref, policy, decay=0.75)
    # 0.75 * 1.5 + 0.25 * 3 = 1.875;  0.75 * 3 + 0.25 * 6 = 3.75;  0.75 * -3 + 0.25 * 0 = -2.25
    torch.testing.assert_close(ref[0], torch.tensor([1.875, 3.75, -2.25]), atol=1e-7, rtol=0)


def test_ema_decay_zero_copies_and_decay_one_never_moves():
    gen = torch.Generator().manual_seed(0)
    policy = [torch.randn(5, 3, generator=gen) * 1e3, torch.randn(4, generator=gen) * 1e-3]
    ref = [torch.randn(5, 3, generator=gen) * 1e-3, torch.randn(4, generator=gen) * 1e3]
    before = [t.clone() for t in ref]
    ema_update_(ref, policy, decay=1.0)
    assert all(torch.equal(r, b) for r, b in zip(ref, before))
    ema_update_(ref, policy, decay=0.0)
    assert all(torch.equal(r, p) for r, p in zip(ref, policy))


def test_maybe_update_runs_every_n_steps():
    policy = _policy(lora=True)
    ref = LoraEMAReference(policy, decay=0.0, update_every=3)
    updated = [step for step in range(8) if ref.maybe_update(step)]
    assert updated == [3, 6]


# ----- LoRA: EMA of the adapter ------------------------------------------------------------------


def test_lora_reference_starts_equal_to_policy_and_leaves_policy_untouched():
    policy = _policy(lora=True)
    _randomize(policy, seed=1, only="lora_B")
    ref = make_reference(policy, ReferenceConfig(ema_decay=0.9, update_every=1))
    assert isinstance(ref, LoraEMAReference)
    start = _policy_logprobs(policy, temperature=0.8)
    torch.testing.assert_close(
        ref.ref_logprobs(*_batch(), temperature=0.8), start, atol=1e-6, rtol=0
    )

    _randomize(policy, seed=2)  # a training step moved the adapter; no EMA update yet
    moved = _policy_logprobs(policy, temperature=0.8)
    assert (moved - start).abs().max() > 1e-3
    torch.testing.assert_close(
        ref.ref_logprobs(*_batch(), temperature=0.8), start, atol=1e-6, rtol=0
    )
    # Scoring with the reference leaves the policy's own weights and mode in place.
    torch.testing.assert_close(_policy_logprobs(policy, temperature=0.8), moved, atol=0, rtol=0)
    assert policy.training


def test_lora_decay_zero_tracks_policy_and_decay_one_stays():
    policy = _policy(lora=True)
    start = _policy_logprobs(policy)
    frozen = LoraEMAReference(policy, decay=1.0, update_every=1)
    copying = LoraEMAReference(policy, decay=0.0, update_every=1)
    _randomize(policy, seed=3)
    frozen.update()
    copying.update()
    torch.testing.assert_close(frozen.ref_logprobs(*_batch()), start, atol=1e-6, rtol=0)
    torch.testing.assert_close(
        copying.ref_logprobs(*_batch()), _policy_logprobs(policy), atol=1e-6, rtol=0
    )


def test_lora_reference_is_deterministic_under_dropout():
    policy = _policy(lora=True, dropout=0.5)
    _randomize(policy, seed=1, only="lora_B")
    ref = LoraEMAReference(policy, decay=0.5, update_every=1)
    first, second = ref.ref_logprobs(*_batch()), ref.ref_logprobs(*_batch())
    assert torch.equal(first, second)
    assert policy.training


def _delta(ema_or_params, scale):
    """scale * B @ A of the q_proj adapter."""
    a = ema_or_params[f"{Q_PROJ}.lora_A.default.weight"]
    b = ema_or_params[f"{Q_PROJ}.lora_B.default.weight"]
    return scale * (b @ a)


def test_lora_ema_equals_merged_ema_when_only_b_moves(tokenizer):
    """EMA(B) A = EMA(B A) when A is fixed: the adapter EMA is then the merged-weight EMA."""
    decay = 0.7
    policy = _policy(lora=True)
    _randomize(policy, seed=1, only="lora_B")
    merged_before = {k: v.clone() for k, v in lm_tensors(policy.model).items()}
    ref = LoraEMAReference(policy, decay=decay, update_every=1)
    _randomize(policy, seed=2, only="lora_B")
    merged_after = lm_tensors(policy.model)
    ref.update()

    # The full-weight EMA of the merged weights, in a plain model.
    merged_ema = {k: decay * merged_before[k] + (1 - decay) * merged_after[k] for k in merged_after}
    plain = build_tiny_model(tokenizer, seed=0)
    plain.load_state_dict(merged_ema)
    full_ema_policy = PolicyWithValueHead(plain, value_head=False)
    torch.testing.assert_close(
        ref.ref_logprobs(*_batch()), _policy_logprobs(full_ema_policy), atol=1e-5, rtol=0
    )

    # The same statement on one weight matrix: W + scale * EMA(B) A = EMA(W + scale * B A).
    layer = policy.language_model().get_submodule(Q_PROJ.removeprefix("base_model.model."))
    key = "model.layers.0.self_attn.q_proj.weight"
    reference_weight = layer.get_base_layer().weight + _delta(
        ref.state_dict(), layer.scaling["default"]
    )
    torch.testing.assert_close(reference_weight, merged_ema[key], atol=1e-6, rtol=0)


def test_lora_ema_cross_term_matches_the_analytic_gap():
    """With both factors moving, EMA(B A) - EMA(B) EMA(A) = d (1 - d) (B1 - B0)(A1 - A0) scale."""
    decay = 0.6
    policy = _policy(lora=True)
    _randomize(policy, seed=1, only="lora_B")
    p0 = {k: v.detach().clone() for k, v in policy.model.named_parameters() if v.requires_grad}
    ref = LoraEMAReference(policy, decay=decay, update_every=1)
    _randomize(policy, seed=2)  # moves A and B
    p1 = {k: v.detach().clone() for k, v in policy.model.named_parameters() if v.requires_grad}
    ref.update()

    scale = 32 / 16  # lora alpha / r
    merged_ema = decay * _delta(p0, scale) + (1 - decay) * _delta(p1, scale)
    adapter_ema = _delta(ref.state_dict(), scale)
    a_key, b_key = f"{Q_PROJ}.lora_A.default.weight", f"{Q_PROJ}.lora_B.default.weight"
    analytic = decay * (1 - decay) * scale * (p1[b_key] - p0[b_key]) @ (p1[a_key] - p0[a_key])
    gap = merged_ema - adapter_ema
    assert gap.abs().max() > 1e-4  # the gap is real, not rounding
    torch.testing.assert_close(gap, analytic, atol=1e-6, rtol=1e-4)


def test_lora_state_dict_round_trip():
    policy = _policy(lora=True)
    ref = LoraEMAReference(policy, decay=0.5, update_every=1)
    _randomize(policy, seed=4)
    ref.update()
    state = ref.state_dict()
    assert state and all("lora_" in k for k in state)

    restored = LoraEMAReference(policy, decay=0.5, update_every=1)  # starts at the current policy
    assert not torch.allclose(restored.ref_logprobs(*_batch()), ref.ref_logprobs(*_batch()))
    restored.load_state_dict(state)
    torch.testing.assert_close(
        restored.ref_logprobs(*_batch()), ref.ref_logprobs(*_batch()), atol=0, rtol=0
    )
    with pytest.raises(RuntimeError, match="missing"):
        restored.load_state_dict({})


# ----- full fine-tuning: a separate copy ---------------------------------------------------------


@pytest.mark.parametrize("offload", [False, True])
def test_full_copy_reference(offload):
    decay = 0.25
    policy = _policy(lora=False)
    ref = make_reference(
        policy, ReferenceConfig(ema_decay=decay, update_every=2, offload_to_cpu=offload)
    )
    assert isinstance(ref, FullCopyEMAReference) and ref.offload_to_cpu == offload
    assert all(p.device.type == "cpu" and not p.requires_grad for p in ref.model.parameters())
    torch.testing.assert_close(
        ref.ref_logprobs(*_batch()), _policy_logprobs(policy), atol=1e-6, rtol=0
    )

    old = policy.model.model.norm.weight.detach().clone()
    _randomize(policy, seed=5)
    new = policy.model.model.norm.weight.detach().clone()
    assert not ref.maybe_update(1)
    torch.testing.assert_close(ref.model.model.model.norm.weight, old, atol=0, rtol=0)
    assert ref.maybe_update(2)
    torch.testing.assert_close(
        ref.model.model.model.norm.weight, decay * old + (1 - decay) * new, atol=1e-7, rtol=0
    )
    assert all(p.grad is None for p in ref.model.parameters())

    state = ref.state_dict()
    other = FullCopyEMAReference(policy, decay=decay, update_every=2, offload_to_cpu=offload)
    other.load_state_dict(state)
    torch.testing.assert_close(
        other.ref_logprobs(*_batch()), ref.ref_logprobs(*_batch()), atol=0, rtol=0
    )


def test_full_copy_never_averages_non_float_tensors():
    policy = _policy(lora=False)
    norm = policy.model.model.norm
    norm.register_parameter(
        "codes", torch.nn.Parameter(torch.tensor([1, 2], dtype=torch.uint8), requires_grad=False)
    )
    norm.register_buffer("stat", torch.tensor([1.0]))
    ref = FullCopyEMAReference(policy, decay=0.0, update_every=1)
    with torch.no_grad():
        norm.codes.fill_(9)
        norm.stat.fill_(9.0)
    ref.update()
    ref_norm = ref.model.model.model.norm
    assert ref_norm.codes.tolist() == [1, 2] and ref_norm.stat.tolist() == [1.0]
    assert "model.norm.codes" not in ref.state_dict()


def test_an_offloaded_copy_moves_once_per_scoring_pass_not_per_micro_batch():
    policy = _policy(lora=False)
    ref = FullCopyEMAReference(policy, decay=0.5, update_every=1, offload_to_cpu=True)
    moves: list[str] = []
    ref.model.to = lambda device: moves.append(torch.device(device).type) or ref.model  # count only
    with ref.scoring_on(torch.device("cuda")):  # as a pass on a GPU policy would
        for _ in range(3):
            ref.ref_logprobs(*_batch())
    assert moves == ["cuda", "cpu"]  # in once, out once (was: in and out for every call)

    # score() opens one such context around all its micro-batches (each ref_logprobs call then
    # enters it again, nested, which moves nothing).
    outermost, open_now, scored = [], [], []
    open_context, ref_logprobs = ref.scoring_on, ref.ref_logprobs

    @contextlib.contextmanager
    def counted(device):
        outermost.append(not open_now)
        open_now.append(device)
        with open_context(device):
            yield
        open_now.pop()

    ref.scoring_on = counted
    ref.ref_logprobs = lambda *args, **kwargs: scored.append(bool(open_now)) or ref_logprobs(*args, **kwargs)
    ids = list(range(100, 112))
    trajs = [Trajectory(task_id="t", group_id="g", token_ids=ids, loss_mask=[0] * 6 + [1] * 6,
                        behavior_logprobs=[0.0] * 12, prompt_length=6) for _ in range(6)]
    score(policy, ref, trajs, list(range(6)), want_old=False, want_values=False, micro_batch_size=2,
          pad_token_id=0, temperature=1.0, seconds=collections.defaultdict(float))
    assert sum(outermost) == 1 and scored == [True, True, True]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA to move the offloaded copy")
def test_offloaded_copy_moves_to_the_gpu_only_for_scoring():
    policy, _ = PolicyWithValueHead.from_config(TINY, LoraConfig(), "cuda", seed=0)
    ref = FullCopyEMAReference(policy, decay=0.5, update_every=1, offload_to_cpu=True)
    input_ids, mask = (t.cuda() for t in _batch())
    with torch.no_grad():
        want = policy(input_ids, mask).logprobs
    torch.testing.assert_close(ref.ref_logprobs(input_ids, mask), want, atol=1e-5, rtol=0)
    assert all(p.device.type == "cpu" for p in ref.model.parameters())
    ref.update()
