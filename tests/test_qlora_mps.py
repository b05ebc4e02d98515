"""QLoRA and MPS without their hardware: 4-bit on MPS is a clear error, the EMA reference never
averages quantized or integer tensors, MPS dtype choice, and the sampler's float32 path (MPS has
no float64). QLoRA on the CPU for real: tests/test_qlora_cpu.py."""

from __future__ import annotations

import pytest
import torch

from grpo.algorithm.reference import LoraEMAReference
from grpo.models import devices
from grpo.models.config import LoraConfig, ModelConfig
from grpo.models.policy import PolicyWithValueHead
from grpo.rollout import sampling

TINY = ModelConfig(name_or_path="tiny-random", dtype="float32")


# ----- QLoRA --------------------------------------------------------------------------------------


def test_4bit_on_mps_is_a_clear_error():
    with pytest.raises(ValueError, match=r"load_in_4bit: true runs on cuda or cpu.*'mps'"):
        PolicyWithValueHead.from_config(
            TINY.model_copy(update={"load_in_4bit": True}), LoraConfig(enabled=True), "mps"
        )


class Params4bit(torch.nn.Parameter):
    """Stands in for bitsandbytes' packed 4-bit weight: the EMA recognises it by its type name."""


def test_lora_ema_skips_4bit_weights_and_integer_tensors():
    policy, _ = PolicyWithValueHead.from_config(TINY, LoraConfig(enabled=True), "cpu", seed=0)
    norm = policy.model.get_base_model().model.norm
    # A trainable float tensor of the 4-bit kind, an integer buffer and an integer parameter.
    norm.register_parameter("packed", Params4bit(torch.ones(4), requires_grad=True))
    norm.register_buffer("absmax", torch.tensor([3, 4], dtype=torch.uint8))
    norm.register_parameter(
        "codes", torch.nn.Parameter(torch.tensor([1, 2], dtype=torch.uint8), requires_grad=False)
    )
    ref = LoraEMAReference(policy, decay=0.0, update_every=1)
    assert not any(name.endswith(("packed", "absmax", "codes")) for name in ref.state_dict())
    assert any("lora_A" in name for name in ref.state_dict())
    with torch.no_grad():
        norm.packed.fill_(7.0)
        norm.absmax.fill_(9)
    ref.update()  # decay 0 copies every averaged tensor: the skipped ones must stay out of it
    assert norm.packed.tolist() == [7.0] * 4 and norm.absmax.tolist() == [9, 9]
    assert not any(name.endswith(("packed", "absmax", "codes")) for name in ref.state_dict())


# ----- MPS dtypes -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("requested", "bf16", "autocast", "want"),
    [
        ("auto", True, True, torch.bfloat16),  # macOS 14+
        ("auto", False, True, torch.float32),  # older macOS: no bf16; fp16 would need loss scaling
        ("auto", True, False, torch.float32),  # torch without MPS autocast
        ("float16", False, True, torch.float16),
        ("float32", False, False, torch.float32),
        ("bfloat16", True, True, torch.bfloat16),
    ],
)
def test_mps_dtype_choice(requested, bf16, autocast, want):
    got = devices.mps_compute_dtype(requested, bf16_supported=bf16, autocast_available=autocast)
    assert got == want and got != torch.float64


def test_mps_dtype_errors():
    with pytest.raises(ValueError, match="macOS 14"):
        devices.mps_compute_dtype("bfloat16", bf16_supported=False, autocast_available=True)
    with pytest.raises(ValueError, match="MPS autocast"):
        devices.mps_compute_dtype("float16", bf16_supported=True, autocast_available=False)
    with pytest.raises(ValueError, match="allowed values"):
        devices.mps_compute_dtype("float64", bf16_supported=True, autocast_available=True)


def test_compute_dtype_and_weights_check_on_mps_follow_the_machine(monkeypatch):
    mps = torch.device("mps")  # a device object only: nothing is allocated on it
    monkeypatch.setattr(devices, "mps_supports_bf16", lambda: False)
    assert devices.compute_dtype(mps, "auto") == torch.float32
    with pytest.raises(ValueError, match="macOS 14"):
        devices.check_weights_dtype(mps, torch.bfloat16)
    devices.check_weights_dtype(mps, torch.float32)
    monkeypatch.setattr(devices, "mps_supports_bf16", lambda: True)
    if torch.amp.is_autocast_available("mps"):
        assert devices.compute_dtype(mps, "auto") == torch.bfloat16
    devices.check_weights_dtype(mps, torch.bfloat16)


# ----- the sampler without float64 -----------------------------------------------------------


def test_wide_dtype_is_float32_only_on_mps():
    assert sampling.wide_dtype(torch.device("mps")) == torch.float32
    assert sampling.wide_dtype(torch.device("cpu")) == torch.float64


def test_sampler_float32_path_matches_float64(monkeypatch):
    gen = torch.Generator().manual_seed(0)
    batch, vocab = 16, 1000
    logits = torch.randn(batch, vocab, generator=gen) * 3  # [B, V]
    temperature = torch.tensor([1.0, 0.7, 0.0, 1.3] * 4)  # [B]
    top_p = torch.tensor([1.0, 0.9, 1.0, 0.5] * 4)  # [B]
    uniforms = torch.rand(batch, sampling.uniforms_per_row(vocab), generator=gen, dtype=torch.float64)
    uniforms[0, 0] = 1.0 - 2.0**-40  # rounds to 1.0 in float32: must not become an infinite score
    want_tokens, want_lp = sampling.sample_next_tokens(logits, temperature, top_p, uniforms)
    monkeypatch.setattr(sampling, "wide_dtype", lambda device: torch.float32)
    tokens, lp = sampling.sample_next_tokens(logits, temperature, top_p, uniforms)
    assert torch.equal(tokens, want_tokens)
    torch.testing.assert_close(lp, want_lp, atol=1e-5, rtol=0)
    assert lp.dtype == torch.float32 and bool(torch.isfinite(lp).all())
