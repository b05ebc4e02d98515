"""The engine copy's RMSNorm layers as one `F.rms_norm` each (grpo/rollout/hf/fused_norms.py): which
layers, the same results as transformers' forward, and sync_weights still reaching them."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from grpo.rollout.base import GenerationRequest, SamplingParams
from grpo.rollout.config import HFEngineConfig
from grpo.rollout.hf.architecture import GENERIC
from grpo.rollout.hf.engine import HFEngine
from grpo.rollout.hf.families.llama import LLAMA
from grpo.rollout.hf.families.qwen3 import QWEN3
from grpo.rollout.hf.fused_norms import agrees_with_rms_norm, fuse_rms_norms

pytestmark = pytest.mark.usefixtures("one_thread")


class GemmaStyleRMSNorm(nn.Module):
    """Gemma's variant: the states are scaled by (1 + weight), not by weight."""

    def __init__(self, width: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * (1.0 + self.weight.float())).to(x.dtype)


def _norms(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if type(m).__name__.endswith("RMSNorm")]


def test_a_llama_norm_passes_the_probe_and_gemmas_does_not():
    llama = LlamaRMSNorm(64, eps=1e-5)
    with torch.no_grad():
        llama.weight.normal_()
    assert agrees_with_rms_norm(llama)
    assert not agrees_with_rms_norm(GemmaStyleRMSNorm(64))
    model = nn.ModuleDict({"a": llama, "b": GemmaStyleRMSNorm(64), "c": nn.LayerNorm(64)})
    # Any class named *RMSNorm is a candidate for a family without a record; the probe decides.
    assert fuse_rms_norms(model, GENERIC.is_norm) == 1
    assert "forward" in vars(llama) and "forward" not in vars(model["b"])
    assert fuse_rms_norms(model, GENERIC.is_norm) == 0  # already fused: nothing more to do
    # A family's record names its own norm classes: nothing else is a candidate.
    other = LlamaRMSNorm(64, eps=1e-5)
    assert fuse_rms_norms(nn.ModuleDict({"a": other, "b": GemmaStyleRMSNorm(64)}), QWEN3.is_norm) == 0
    assert fuse_rms_norms(other, LLAMA.is_norm) == 1


def test_fused_norm_gives_transformers_bits_in_fp32_and_falls_back_for_mixed_dtypes():
    norm = LlamaRMSNorm(64, eps=1e-5)
    with torch.no_grad():
        norm.weight.normal_()
    x = 4 * torch.randn(3, 7, 64, generator=torch.Generator().manual_seed(1))
    expected = norm(x)
    mixed_expected = norm(x.to(torch.bfloat16))  # fp32 weight x bf16 states: fp32 out
    assert fuse_rms_norms(norm, LLAMA.is_norm) == 1
    assert torch.equal(norm(x), expected)
    mixed = norm(x.to(torch.bfloat16))
    assert mixed.dtype == torch.float32 and torch.equal(mixed, mixed_expected)
    twin = copy.deepcopy(norm)  # its forward reads its own weight, not the original's
    with torch.no_grad():
        twin.weight.mul_(2.0)
    assert torch.equal(twin(x), 2.0 * expected) and torch.equal(norm(x), expected)


def _generate(engine, tokenizer, prompts):
    requests = [
        GenerationRequest(tokenizer.encode(p), SamplingParams(max_new_tokens=8, seed=i))
        for i, p in enumerate(prompts)
    ]
    return engine.generate(requests)


PROMPTS = ["What is 964 * 494?", "Hi", "A longer prompt, with a few more tokens in it."]


def test_the_engine_copy_fuses_every_norm_and_samples_the_same(varied_tiny_model, tokenizer):
    engine = HFEngine(varied_tiny_model, tokenizer, dtype=torch.float32)
    plain = HFEngine(varied_tiny_model, tokenizer, HFEngineConfig(fuse_norms=False), dtype=torch.float32)
    norms = _norms(engine.runner.model)
    assert len(norms) == 2 * 2 + 1  # two per decoder layer and the final one
    assert all("forward" in vars(m) for m in norms)
    assert not any("forward" in vars(m) for m in _norms(plain.runner.model))
    assert not any("forward" in vars(m) for m in _norms(varied_tiny_model))  # the policy's
    fused, unfused = _generate(engine, tokenizer, PROMPTS), _generate(plain, tokenizer, PROMPTS)
    assert [r.token_ids for r in fused] == [r.token_ids for r in unfused]
    assert [r.behavior_logprobs for r in fused] == [r.behavior_logprobs for r in unfused]


def test_sync_weights_reaches_the_fused_norms(varied_tiny_model, tokenizer):
    engine = HFEngine(varied_tiny_model, tokenizer, dtype=torch.float32)
    with torch.no_grad():
        for name, param in varied_tiny_model.named_parameters():
            if "norm" in name:
                param.mul_(-2.0).add_(0.5)
    engine.sync_weights(varied_tiny_model)
    fresh = HFEngine(varied_tiny_model, tokenizer, HFEngineConfig(fuse_norms=False), dtype=torch.float32)
    synced, expected = _generate(engine, tokenizer, PROMPTS), _generate(fresh, tokenizer, PROMPTS)
    assert [r.behavior_logprobs for r in synced] == [r.behavior_logprobs for r in expected]
    final = engine.runner.model.model.norm
    assert torch.equal(final.weight, varied_tiny_model.model.norm.weight)
