"""The engine's KV cache layouts (grpo/rollout/hf/kv_cache.py): keys stored transposed hold and serve
the same values as the plain layout (so every request samples the same), a bf16 cache is what
the CPU default picks for the bf16 copy and stays close to an fp32 forward, and the engine's
attention takes fp32 queries against a bf16 cache."""

from __future__ import annotations

import pytest
import torch
from conftest import fp32_engine
from test_continuous_batching import ConversationFeed, _assert_same
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from grpo.config import config_from_dict
from grpo.rollout.base import GenerationRequest, SamplingParams
from grpo.rollout.config import HFEngineConfig
from grpo.rollout.hf.decode_attention import _grouped_decode, engine_attention
from grpo.rollout.hf.engine import HFEngine
from grpo.rollout.hf.kv_cache import PreallocatedCache
from grpo.rollout.registry import make_engine

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def model(varied_tiny_model):
    return varied_tiny_model


@pytest.fixture
def prompts(tokenizer):
    prefix = tokenizer.encode("You are a careful calculator: answer with the number only, please.")
    return [
        prefix + tokenizer.encode(" What is 964 * 494?"),
        prefix + tokenizer.encode(" A longer question, with a few more tokens than the others."),
        tokenizer.encode("Hi"),
    ]


def _keys(cache: PreallocatedCache, layer: int = 0) -> torch.Tensor:
    """A layer's keys as [rows, heads, capacity, dim], whatever the storage layout."""
    return cache.layers[layer]._key_columns(slice(None), 0, cache.capacity)


def test_transposed_storage_holds_what_the_plain_layout_holds():
    gen = torch.Generator().manual_seed(0)
    caches = [
        PreallocatedCache(1, 4, 10, zero_columns=10, keys_transposed=t) for t in (False, True)
    ]
    prompt_k, prompt_v = torch.randn(2, 4, 2, 3, 5, generator=gen)  # [rows 4, heads 2, 3, dim 5]
    step_k, step_v = torch.randn(2, 4, 2, 1, 5, generator=gen)
    for cache in caches:
        cache.set_window(slice(0, 4), lo=2, pos=2)
        keys, values = cache.layers[0].update(prompt_k, prompt_v)
        assert keys.shape == (4, 2, 3, 5) and torch.equal(keys, prompt_k)
        cache.set_window(slice(0, 4), lo=2, pos=5)
        keys, values = cache.layers[0].update(step_k, step_v)  # a decode step: columns [2, 6)
        assert torch.equal(keys[:, :, 3:], step_k) and torch.equal(values[:, :, :3], prompt_v)
        cache.copy_rows(torch.tensor([3, 0]), 2, 6, first=1)  # rows 1, 2 <- rows 3, 0
        cache.zero(slice(0, 1), 4, 6)
    stored = caches[1].layers[0].keys
    assert stored.shape == (4, 2, 5, 10)  # [rows, heads, dim, capacity]
    assert torch.equal(_keys(caches[0]), _keys(caches[1]))
    assert torch.equal(caches[0].layers[0].values, caches[1].layers[0].values)
    expected_row1 = torch.cat([prompt_k[3], step_k[3]], dim=1)  # [heads, 4, dim]
    assert torch.equal(_keys(caches[1])[1, :, 2:6], expected_row1)
    assert torch.equal(_keys(caches[1])[0, :, 4:6], torch.zeros(2, 2, 5))


@pytest.mark.parametrize("decode_mode", ["dynamic", "static"])
def test_transposed_keys_sample_what_plain_keys_sample(model, tokenizer, prompts, decode_mode):
    requests = [
        GenerationRequest(prompts[i % 3], SamplingParams(max_new_tokens=4 + 5 * i, seed=i))
        for i in range(5)
    ]
    engines = [
        fp32_engine(model, tokenizer, keys_transposed=t, decode_mode=decode_mode, max_batch_size=3,
                    compact_fraction=0.0, shared_prefix_min_tokens=1)
        for t in (False, True)
    ]
    plain, transposed = (engine.generate(requests) for engine in engines)
    for want, got in zip(plain, transposed, strict=True):
        _assert_same(want, got)
    metrics = engines[1].last_metrics
    assert metrics["shared_prefix_tokens"] > 0 and metrics["compactions"] > 0


def test_transposed_keys_resume_sessions_like_plain_keys(model, tokenizer, prompts):
    first = [
        GenerationRequest(prompts[i], SamplingParams(max_new_tokens=5 + 3 * i, seed=i), session=s)
        for i, s in enumerate("abc")
    ]
    first.append(GenerationRequest(prompts[0], SamplingParams(max_new_tokens=30, seed=9)))
    observation = tokenizer.encode(" The tool says 42.")
    results = []
    for transposed in (False, True):
        engine = fp32_engine(model, tokenizer, keys_transposed=transposed)
        feed = ConversationFeed({0: list(first)}, observation, delay={"a": 0, "b": 3, "c": 1})
        engine.serve(feed)
        assert engine.last_metrics["resumed_requests"] == 3
        results.append([feed.results[t] for t in sorted(feed.results)])
    for want, got in zip(*results, strict=True):
        _assert_same(want, got)


def test_a_bf16_cache_resumes_sessions_like_an_fp32_one(model, tokenizer, prompts):
    # Resumed rows are written through an index tensor (index_put, which does not cast dtypes).
    first = [
        GenerationRequest(prompts[i], SamplingParams(max_new_tokens=4, seed=i), session=s)
        for i, s in enumerate("ab")
    ]
    first.append(GenerationRequest(prompts[2], SamplingParams(max_new_tokens=20, seed=9)))
    observation = tokenizer.encode(" The tool says 42.")
    results = []
    for cache_dtype in ("float32", "bfloat16"):
        engine = fp32_engine(model, tokenizer, kv_cache_dtype=cache_dtype)
        feed = ConversationFeed({0: list(first)}, observation, delay={"a": 0, "b": 1})
        engine.serve(feed)
        assert not feed.failed and engine.last_metrics["resumed_requests"] == 2
        results.append([feed.results[t] for t in sorted(feed.results)])
    for want, got in zip(*results, strict=True):
        assert len(got.token_ids) == len(want.token_ids)
        assert got.behavior_logprobs[0] == pytest.approx(want.behavior_logprobs[0], abs=0.1)


def test_the_cpu_default_is_a_transposed_bf16_cache_for_the_bf16_copy(model, tokenizer):
    default = HFEngine(model, tokenizer)  # bf16 matmuls on this CPU
    assert (default.runner.kv_cache_dtype, default.runner.keys_transposed) == (torch.bfloat16, True)
    fp32 = fp32_engine(model, tokenizer)
    assert (fp32.runner.kv_cache_dtype, fp32.runner.keys_transposed) == (torch.float32, False)
    assert HFEngine(model, tokenizer, dtype=None).runner.kv_cache_dtype is None
    sdpa = HFEngine(model, tokenizer, HFEngineConfig(decode_attention="sdpa"))  # SDPA wants one dtype
    assert (sdpa.runner.kv_cache_dtype, sdpa.runner.keys_transposed) == (None, False)
    no_copy = HFEngine(model, tokenizer, HFEngineConfig(copy_weights=False))
    assert no_copy.runner.kv_cache_dtype is None


def test_a_cache_dtype_the_attention_cannot_read_is_refused(model, tokenizer):
    with pytest.raises(ValueError, match="kv_cache_dtype bfloat16 differs from the model"):
        HFEngine(model, tokenizer, HFEngineConfig(decode_attention="sdpa", kv_cache_dtype="bfloat16"))
    with pytest.raises(ValueError, match="kv_cache_dtype\n  Input should be 'auto', 'model', 'bfloat16'"):
        HFEngineConfig(kv_cache_dtype="bf16")
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        HFEngineConfig(kv_cache_dtype="int8")


def test_the_config_names_the_cache_dtype(model, tokenizer):
    def engine(dtype="bfloat16", **hf):
        # model.dtype pinned: `auto` is bf16 or fp32 by this host's CPU (devices.py)
        config = config_from_dict({"model": {"dtype": dtype}, "rollout": {"hf": hf}})
        return make_engine("hf", policy=model, tokenizer=tokenizer, config=config)

    assert engine().runner.kv_cache_dtype == torch.bfloat16  # auto, CPU: the bf16 copy's dtype
    assert engine("float32").runner.kv_cache_dtype == torch.float32  # auto, CPU: the fp32 copy's
    assert engine(kv_cache_dtype="model").runner.kv_cache_dtype is None
    assert engine(kv_cache_dtype="float32").runner.kv_cache_dtype == torch.float32


@torch.no_grad()
def test_a_bf16_cache_is_used_and_stays_close_to_an_fp32_forward(model, tokenizer, prompts):
    requests = [
        GenerationRequest(p, SamplingParams(max_new_tokens=12, seed=i)) for i, p in enumerate(prompts)
    ]
    fp32 = fp32_engine(model, tokenizer).generate(requests)
    engine = fp32_engine(model, tokenizer, kv_cache_dtype="bfloat16", decode_mode="static")
    results = engine.generate(requests)
    keys = engine.runner.static_decoder.cache.layers[0].keys
    assert keys.dtype == torch.bfloat16 and engine.runner.keys_transposed
    deltas = []
    for prompt, result in zip(prompts, results):
        logits = model(torch.tensor([list(prompt) + result.token_ids])).logits[0]
        expected = torch.log_softmax(logits[len(prompt) - 1 : -1].float(), -1).gather(
            -1, torch.tensor(result.token_ids)[:, None]
        )[:, 0]
        deltas.append((torch.tensor(result.behavior_logprobs) - expected).abs())
    assert torch.cat(deltas).mean() < 0.05
    # The bf16 cache is really read: the log-probs are not the fp32 cache's.
    assert any(r.behavior_logprobs != f.behavior_logprobs for r, f in zip(results, fp32))


def test_the_engine_attention_reads_a_bf16_cache_with_fp32_queries():
    gen = torch.Generator().manual_seed(0)
    query = torch.randn(2, 6, 1, 8, generator=gen)
    key, value = torch.randn(2, 2, 2, 5, 8, generator=gen).to(torch.bfloat16)
    allowed = torch.ones(2, 1, 1, 5, dtype=torch.bool)
    allowed[1, ..., :2] = False

    class Layer(torch.nn.Module):
        num_key_value_groups, is_causal = 3, True

    out, _ = engine_attention(Layer(), query, key, value, allowed, scaling=0.25)
    assert out.dtype == torch.float32  # back in the states' dtype
    want = _grouped_decode(query.to(torch.bfloat16), key, value, allowed, 0.25).float()
    assert torch.equal(out, want)
    # Prefill (several queries) goes to SDPA the same way: the query rounded to the cache's dtype.
    queries = torch.randn(2, 6, 5, 8, generator=gen)
    causal = torch.ones(5, 5, dtype=torch.bool).tril().expand(2, 1, 5, 5)
    out, _ = engine_attention(Layer(), queries, key, value, causal)
    want, _ = sdpa_attention_forward(Layer(), queries.to(torch.bfloat16), key, value, causal)
    assert out.dtype == torch.float32 and torch.equal(out, want.float())
