"""grpo/forward/cache_argument.py: the KV cache goes to a model by the name its forward takes, and
comes back from whichever field the output has; our forwards raise no deprecation warning."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import pytest
import torch
from test_policy import _policy
from torch import nn

from grpo.forward.cache_argument import cache_keyword, output_cache
from grpo.forward.common_prefix import CommonPrefix
from grpo.rollout.base import GenerationRequest, SamplingParams
from grpo.rollout.config import HFEngineConfig
from grpo.rollout.hf.engine import HFEngine

pytestmark = pytest.mark.usefixtures("one_thread")


class _Old(nn.Module):  # transformers 4.x
    def forward(self, input_ids, past_key_values=None, use_cache=None):
        return input_ids


class _New(nn.Module):  # transformers 5.x
    def forward(self, input_ids, cache=None, use_cache=None):
        return input_ids


class _Wrapper(nn.Module):  # a peft model: **kwargs passed on to base_model.model
    def __init__(self, inner):
        super().__init__()
        self.base_model = nn.Module()
        self.base_model.model = inner

    def forward(self, **kwargs):
        return self.base_model.model(**kwargs)


class _Opaque(nn.Module):
    def forward(self, **kwargs):
        return kwargs


def test_the_keyword_is_the_one_the_forward_takes():
    assert cache_keyword(_Old()) == "past_key_values"
    assert cache_keyword(_New()) == "cache"
    assert cache_keyword(_Wrapper(_New())) == "cache"
    assert cache_keyword(_Wrapper(_Old())) == "past_key_values"
    assert cache_keyword(_Opaque()) == "past_key_values"  # nothing to ask: the name every version reads


def test_the_cache_comes_back_from_either_field():
    @dataclass
    class NewOutput:
        last_hidden_state: object = None
        cache: object = None

    @dataclass
    class OldOutput:
        last_hidden_state: object = None
        past_key_values: object = None

    assert output_cache(NewOutput(cache="kv")) == "kv"
    assert output_cache(OldOutput(past_key_values="kv")) == "kv"


@pytest.mark.parametrize("lora", [False, True])
def test_segments_common_prefix_and_the_engine_raise_no_deprecation_warning(tokenizer, lora):
    policy = _policy(lora=lora)
    policy.packing = False
    gen = torch.Generator().manual_seed(3)
    shared = torch.randint(0, 2000, (48,), generator=gen)
    ids = torch.stack([torch.cat([shared, torch.randint(0, 2000, (6,), generator=gen)]) for _ in range(8)])
    mask = torch.ones_like(ids)
    assert len(policy.prefix_segments(ids, mask)) == 2  # the shared columns run once, with a cache
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        policy(ids, mask).logprobs.sum().backward()
        prefix = CommonPrefix(shared.tolist())
        prefix.finish()
        policy(ids, mask, prefix=prefix)
        engine = HFEngine(policy, tokenizer, HFEngineConfig(copy_weights=not lora))
        engine.generate([GenerationRequest(ids[0, :50].tolist(), SamplingParams(max_new_tokens=4, seed=0))])
    cache_warnings = [str(w.message) for w in caught if "past_key_values" in str(w.message)]
    assert cache_warnings == []
