"""The engine's decode attention (grpo/rollout/hf/decode_attention.py): the same attention as
transformers' SDPA path for one query token with grouped key/value heads and masked columns,
SDPA itself for everything else, and only the engine's copy switched to it."""

from __future__ import annotations

import math

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from grpo.rollout.base import GenerationRequest, SamplingParams
from grpo.rollout.config import HFEngineConfig
from grpo.rollout.hf.decode_attention import ENGINE_ATTENTION, engine_attention
from grpo.rollout.hf.engine import HFEngine


class _Layer(torch.nn.Module):
    """What attention functions read from their module: the group count and training flag."""

    def __init__(self, groups: int) -> None:
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True


def _qkv(batch=3, heads=6, kv_heads=2, length=7, queries=1, dim=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, queries, dim, generator=gen)
    k = torch.randn(batch, kv_heads, length, dim, generator=gen)
    v = torch.randn(batch, kv_heads, length, dim, generator=gen)
    return q, k, v


def test_one_query_token_matches_sdpa_with_grouped_heads_and_masked_columns():
    q, k, v = _qkv()
    allowed = torch.ones(3, 1, 1, 7, dtype=torch.bool)
    allowed[0, ..., :3] = False  # a left-padded row
    allowed[2, ..., [1, 4]] = False
    # Masked columns hold values that would dominate if they leaked into the softmax.
    k[0, :, :3] = 50.0
    layer = _Layer(groups=3)
    got, _ = engine_attention(layer, q, k, v, allowed, scaling=0.3)
    want, _ = sdpa_attention_forward(layer, q, k, v, allowed, scaling=0.3)
    assert got.shape == (3, 1, 6, 8)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)

    # By hand for row 0, head 4 (key/value head 1): softmax over the 4 unmasked columns.
    scores = (q[0, 4, 0] @ k[0, 1, 3:].T) * 0.3
    expected = torch.softmax(scores, -1) @ v[0, 1, 3:]
    torch.testing.assert_close(got[0, 0, 4], expected, atol=1e-6, rtol=0)


def test_the_default_scale_is_one_over_root_head_dim():
    q, k, v = _qkv(heads=4, kv_heads=4)
    allowed = torch.ones(3, 1, 1, 7, dtype=torch.bool)
    layer = _Layer(groups=1)
    got, _ = engine_attention(layer, q, k, v, allowed)
    want, _ = engine_attention(layer, q, k, v, allowed, scaling=1 / math.sqrt(8))
    torch.testing.assert_close(got, want, atol=0, rtol=0)


@pytest.mark.parametrize(
    "case", ["prefill", "no_mask", "float_mask", "dropout", "softcap"]
)
def test_everything_else_is_sdpa_itself(case):
    q, k, v = _qkv(queries=7 if case == "prefill" else 1)
    layer = _Layer(groups=3)
    mask = torch.ones(3, 1, q.shape[2], 7, dtype=torch.bool).tril(diagonal=0 if case == "prefill" else 6)
    kwargs = {}
    if case == "no_mask":
        mask = None
    elif case == "float_mask":
        mask = torch.zeros(3, 1, 1, 7)
    elif case == "dropout":
        layer.train()
        kwargs["dropout"] = 0.5
    elif case == "softcap":
        kwargs["softcap"] = 30.0
    if case == "softcap":  # SDPA refuses it, and so does the engine's attention
        with pytest.raises(ValueError, match="softcap"):
            engine_attention(layer, q, k, v, mask, **kwargs)
        return
    torch.manual_seed(0)
    got, _ = engine_attention(layer, q, k, v, mask, **kwargs)
    torch.manual_seed(0)
    want, _ = sdpa_attention_forward(layer, q, k, v, mask, **kwargs)
    assert torch.equal(got, want)


def test_only_the_engine_copy_uses_it_and_sampling_is_unchanged(varied_tiny_model, tokenizer):
    model = varied_tiny_model
    policy_attention = model.config._attn_implementation
    grouped = HFEngine(model, tokenizer, dtype=torch.float32, seed=0)
    sdpa = HFEngine(model, tokenizer, HFEngineConfig(decode_attention="sdpa"), dtype=torch.float32, seed=0)
    assert grouped.runner.model.config._attn_implementation == ENGINE_ATTENTION
    assert sdpa.runner.model.config._attn_implementation == "sdpa"
    assert model.config._attn_implementation == policy_attention

    prompts = [tokenizer.encode("What is 964 * 494?"), tokenizer.encode("Hi"), tokenizer.encode("Hi")]
    requests = [
        GenerationRequest(p, SamplingParams(temperature=1.0, max_new_tokens=12, seed=i))
        for i, p in enumerate(prompts)
    ]
    got, want = grouped.generate(requests), sdpa.generate(requests)
    for a, b in zip(got, want, strict=True):
        assert a.token_ids == b.token_ids
        torch.testing.assert_close(torch.tensor(a.behavior_logprobs), torch.tensor(b.behavior_logprobs), atol=1e-5, rtol=0)
    assert grouped.last_metrics["decode_steps"] == 11


def test_an_unknown_decode_attention_is_refused(tiny_model, tokenizer):
    with pytest.raises(ValueError, match="decode_attention\n  Input should be 'grouped' or 'sdpa'"):
        HFEngineConfig(decode_attention="flash")
