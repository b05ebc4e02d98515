"""A batch's kept prefix (HFEngine `prefix_attention_min_tokens`): decode steps attend to the
prompts' shared prefix once for all the rows that hold it (grpo/rollout/hf/decode_attention.py
`_shared_prefix_decode`), and requests that join later with that prefix get its keys and values
written instead of prefilled (kv_cache.py `keep_prefix`, `write_prefix`). Every request still
samples what it samples alone (fp32, seeded), in waves, joins, compaction and resumed sessions."""

from __future__ import annotations

import pytest
import torch
from conftest import fp32_engine
from test_continuous_batching import ConversationFeed, ScheduledFeed, _alone, _assert_same

from grpo.rollout.base import GenerationRequest, SamplingParams
from grpo.rollout.config import HFEngineConfig
from grpo.rollout.hf.decode_attention import (
    PrefixAttention,
    _grouped_decode,
    _shared_prefix_decode,
    engine_attention,
)
from grpo.rollout.hf.engine import HFEngine
from grpo.rollout.hf.kv_cache import PreallocatedCache

pytestmark = pytest.mark.usefixtures("one_thread")


# ---------------------------------------------------------------------------- the attention
def _cache_rows(batch=4, kv_heads=2, columns=12, dim=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    keys = torch.randn(batch, kv_heads, columns, dim, generator=gen)
    values = torch.randn(batch, kv_heads, columns, dim, generator=gen)
    query = torch.randn(batch, 3 * kv_heads, 1, dim, generator=gen)
    return query, keys, values


def test_shared_prefix_attention_is_attention_over_the_prefix_and_the_own_columns():
    # Rows 0-2 hold a 4-token prefix at different columns (starts 0, 2, 3); row 3 does not hold
    # it and starts at column 1. Row 1 has a masked gap at columns 7-8.
    query, keys, values = _cache_rows()
    prefix = 4
    starts, holds = [0, 2, 3, 1], [True, True, True, False]
    keys[:3, :, :prefix] = keys[0, :, :prefix]  # the prefix's keys and values, once per row
    values[:3, :, :prefix] = values[0, :, :prefix]
    for b in (1, 2):  # moved right to the row's start
        keys[b, :, starts[b] : starts[b] + prefix] = keys[0, :, :prefix].clone()
        values[b, :, starts[b] : starts[b] + prefix] = values[0, :, :prefix].clone()
    allowed = torch.zeros(4, 12, dtype=torch.bool)
    for b, start in enumerate(starts):
        allowed[b, start:] = True
    allowed[1, 7:9] = False
    want = _grouped_decode(query, keys, values, allowed[:, None, None], 0.3)

    # Own columns: from the first column some row needs beyond the prefix (row 3's column 1).
    own_lo = 1
    own = allowed[:, own_lo:].clone()
    for b, (start, held) in enumerate(zip(starts, holds)):
        if held:
            own[b, : start + prefix - own_lo] = False  # its prefix columns: not twice
    mask = torch.cat([torch.tensor(holds)[:, None].expand(-1, prefix), own], dim=1)
    prefix_keys = keys[0, :, :prefix].transpose(-1, -2).contiguous()  # [kv, D, P]
    prefix_values = values[0, :, :prefix].contiguous()  # [kv, P, D]
    got = _shared_prefix_decode(
        query, keys[:, :, own_lo:], values[:, :, own_lo:], mask[:, None, None],
        prefix_keys, prefix_values, 0.3,
    )
    assert got.shape == (4, 1, 6, 8)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)

    # By hand, row 2, head 5 (kv head 1): the prefix, then its own columns 7..11.
    columns = list(range(3, 12))
    scores = (query[2, 5, 0] @ keys[2, 1, columns].T) * 0.3
    expected = torch.softmax(scores, -1) @ values[2, 1, columns]
    torch.testing.assert_close(got[2, 0, 5], expected, atol=1e-6, rtol=0)


def test_the_engine_attention_takes_the_layers_prefix_and_refuses_it_for_prefill():
    query, keys, values = _cache_rows(batch=2, columns=6)
    prefix_keys = torch.randn(2, 8, 3)
    prefix_values = torch.randn(2, 3, 8)
    layer = torch.nn.Module()
    layer.layer_idx, layer.is_causal, layer.num_key_value_groups = 1, True, 3
    shared = PrefixAttention([(torch.zeros(2, 8, 3), torch.zeros(2, 3, 8)), (prefix_keys, prefix_values)])
    mask = torch.ones(2, 1, 1, 9, dtype=torch.bool)
    got, _ = engine_attention(layer, query, keys, values, mask, scaling=0.5, shared_prefix=shared)
    want = _shared_prefix_decode(query, keys, values, mask, prefix_keys, prefix_values, 0.5)
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    prefill = torch.ones(2, 1, 6, 6, dtype=torch.bool).tril()
    with pytest.raises(ValueError, match="shared_prefix attention covers decode steps only"):
        engine_attention(
            layer, torch.randn(2, 6, 6, 8), keys, values, prefill, shared_prefix=shared
        )


def test_a_kept_prefix_is_written_back_bit_for_bit():
    cache = PreallocatedCache(2, batch=3, capacity=10, zero_columns=10, keys_transposed=True)
    cache.set_window(slice(0, 1), lo=2, pos=2)
    for layer in cache.layers:
        layer.update(torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4))
    cache.keep_prefix((7, 8, 9, 10), row=0, lo=2)
    assert cache.prefix_tokens == (7, 8, 9, 10)
    keys, values = cache.prefix.layers[1]
    assert keys.shape == (2, 4, 4) and values.shape == (2, 4, 4) and keys.is_contiguous()
    torch.testing.assert_close(keys, cache.layers[1].key_view[0, :, 2:6].transpose(-1, -2), atol=0, rtol=0)
    cache.write_prefix(slice(1, 3), lo=5)
    for layer in cache.layers:
        for row in (1, 2):
            assert torch.equal(layer.key_view[row, :, 5:9], layer.key_view[0, :, 2:6])
            assert torch.equal(layer.values[row, :, 5:9], layer.values[0, :, 2:6])
        assert not layer.values[1, :, :5].any() and not layer.values[1, :, 9:].any()
    assert cache.holds_prefix(1, 5) and cache.holds_prefix(0, 2) and not cache.holds_prefix(1, 4)
    cache.layers[1].values[2, 1, 6, 3] += 1e-3  # one value off: that row no longer holds it
    assert not cache.holds_prefix(2, 5)
    with pytest.raises(RuntimeError, match="keeps no shared prefix"):
        PreallocatedCache(1, batch=1, capacity=4, zero_columns=4).write_prefix(slice(0, 1), 0)


# ---------------------------------------------------------------------------- the engine
@pytest.fixture
def model(varied_tiny_model):
    return varied_tiny_model


@pytest.fixture
def prefix(tokenizer):
    ids = tokenizer.encode(
        "You are a careful calculator. Use the tools you are given, one call at a time, and "
        "answer with the number only."
    )
    assert len(ids) >= 20
    return ids


@pytest.fixture
def prompts(tokenizer, prefix):
    tails = [" What is 964 * 494?", " Hi", " A longer question, with a few more tokens in it."]
    return [prefix + tokenizer.encode(tail) for tail in tails]


def request(prompt, **sampling) -> GenerationRequest:
    return GenerationRequest(list(prompt), SamplingParams(**sampling))


def _engine(model, tokenizer, **settings) -> HFEngine:
    # shared_prefix_min_tokens 1: the tiny prompts' prefix is shared; the kept prefix needs 20
    # tokens, and every decode step that saves a column attends it once.
    settings = {"prefix_attention_min_cells": 1, "shared_prefix_min_tokens": 1,
                "prefix_attention_min_tokens": 20, **settings}
    return fp32_engine(model, tokenizer, **settings)


def _serve_as_alone(engine: HFEngine, feed, model, tokenizer) -> dict:
    """Serve `feed`; every request's result is what it samples alone. The engine's metrics."""
    engine.serve(feed)
    assert not feed.failed
    expected = _alone(fp32_engine(model, tokenizer), feed.tickets)
    for ticket, want in enumerate(expected):
        _assert_same(want, feed.results[ticket])
    return engine.last_metrics


def test_rows_holding_the_prefix_sample_what_they_sample_alone(model, tokenizer, prompts, prefix):
    requests = [
        request(prompts[0], max_new_tokens=9, seed=1),
        *[request(prompts[1], max_new_tokens=6 + k, seed=10 + k) for k in range(3)],
        request(prompts[2], max_new_tokens=12, seed=2, temperature=0.7, top_p=0.9),
        request(prompts[0], max_new_tokens=5, temperature=0.0),
    ]
    engine = _engine(model, tokenizer)
    got = engine.generate(requests)
    expected = _alone(fp32_engine(model, tokenizer), requests)
    for want, result in zip(expected, got):
        _assert_same(want, result)
    metrics = engine.last_metrics
    # Every decode step attended the prefix once: all rows hold it.
    assert metrics["prefix_attention_steps"] == metrics["decode_steps"] > 0
    # Unless it saves too few cache cells: 6 rows x the prefix's columns at most.
    few = _engine(model, tokenizer, prefix_attention_min_cells=6 * len(prefix) + 1)
    few.generate(requests)
    assert few.last_metrics["prefix_attention_steps"] == 0
    few = _engine(model, tokenizer, prefix_attention_min_cells=6 * len(prefix))
    few.generate(requests)
    assert few.last_metrics["prefix_attention_steps"] > 0  # the first steps, all 6 rows live
    off = fp32_engine(model, tokenizer, shared_prefix_min_tokens=1, prefix_attention_min_tokens=0)
    off.generate(requests)
    assert off.last_metrics["prefix_attention_steps"] == 0
    assert off.last_metrics["decode_steps"] == metrics["decode_steps"]


def test_a_prefix_shorter_than_the_minimum_is_not_kept(model, tokenizer, prompts, prefix):
    engine = fp32_engine(model, tokenizer, shared_prefix_min_tokens=1,
                         prefix_attention_min_tokens=len(prefix) + 1)
    engine.generate([request(p, max_new_tokens=4, seed=i) for i, p in enumerate(prompts)])
    assert engine.last_metrics["prefix_attention_steps"] == 0
    assert engine.last_metrics["shared_prefix_tokens"] == 2 * len(prefix)


def test_later_requests_with_the_prefix_skip_its_prefill_and_others_attend_whole(
    model, tokenizer, prompts, prefix
):
    # Call 0: three distinct prompts start a batch and keep their prefix. Call 3: a group of one
    # prompt with the prefix joins (written, not prefilled), and a prompt without it (its row
    # attends all its columns; the steps still attend the prefix once for the others).
    stranger = tokenizer.encode("Translate to French: the cat sits on the mat, quietly.")
    schedule = {
        0: [request(p, max_new_tokens=8 + 4 * i, seed=i) for i, p in enumerate(prompts)],
        3: [
            *[request(prompts[1], max_new_tokens=5 + k, seed=20 + k) for k in range(2)],
            request(stranger, max_new_tokens=7, seed=30),
        ],
    }
    engine = _engine(model, tokenizer, compact_fraction=0.0)
    metrics = _serve_as_alone(engine, ScheduledFeed(schedule), model, tokenizer)
    assert metrics["kept_prefix_tokens"] == len(prefix)  # one distinct prompt joined with it
    rests = sum(len(p) - len(prefix) for p in prompts)
    joined = len(prompts[1]) - len(prefix) + len(stranger)
    assert metrics["prefill_tokens"] == len(prefix) + rests + joined
    assert metrics["prefix_attention_steps"] == metrics["decode_steps"]
    assert metrics["compactions"] > 0


def test_groups_joining_one_at_a_time_keep_the_prefix_from_a_row_in_the_batch(
    model, tokenizer, prompts, prefix
):
    # Continuous batching: each task's group joins on its own. The second group shares the
    # prefix with the first group's rows: it is kept from them (they all hold it: copies of one
    # prefill), and the second and third groups get it written instead of prefilled.
    schedule = {
        0: [request(prompts[0], max_new_tokens=12, seed=k) for k in range(2)],
        2: [request(prompts[1], max_new_tokens=8, seed=10 + k) for k in range(2)],
        4: [request(prompts[2], max_new_tokens=5, seed=20)],
    }
    engine = _engine(model, tokenizer)
    metrics = _serve_as_alone(engine, ScheduledFeed(schedule), model, tokenizer)
    assert metrics["kept_prefix_tokens"] == 2 * len(prefix)
    assert metrics["prefill_tokens"] == len(prompts[0]) + sum(
        len(p) - len(prefix) for p in prompts[1:]
    )
    # The first two steps ran before the second group came: no prefix kept yet.
    assert metrics["prefix_attention_steps"] == metrics["decode_steps"] - 2


def test_sessions_come_back_to_rows_that_hold_the_prefix(model, tokenizer, prompts):
    first = [
        GenerationRequest(prompts[i], SamplingParams(max_new_tokens=5 + 3 * i, seed=i), session=s)
        for i, s in enumerate("abc")
    ]
    joining = [request(prompts[1], max_new_tokens=30, seed=20)]
    observation = tokenizer.encode(" The tool says 42.")
    feed = ConversationFeed({0: first, 3: joining}, observation, delay={"a": 0, "b": 4, "c": 1})
    metrics = _serve_as_alone(_engine(model, tokenizer), feed, model, tokenizer)
    assert len(feed.results) == 7
    assert metrics["resumed_requests"] == 3
    assert metrics["prefix_attention_steps"] == metrics["decode_steps"]


def test_only_dynamic_decode_with_the_engines_attention_keeps_a_prefix(model, tokenizer):
    assert _engine(model, tokenizer).settings.prefix_attention_min_tokens == 20
    assert _engine(model, tokenizer, decode_mode="static").settings.prefix_attention_min_tokens == 0
    assert _engine(model, tokenizer, decode_attention="sdpa").settings.prefix_attention_min_tokens == 0
    with pytest.raises(ValueError, match="prefix_attention_min_cells\n  Input should be greater than or equal to 1"):
        HFEngineConfig(prefix_attention_min_cells=0)
    with pytest.raises(ValueError, match="prefix_attention_min_tokens\n  Input should be greater than or equal to 0"):
        HFEngineConfig(prefix_attention_min_tokens=-1)
    with pytest.raises(ValueError, match="prefix_attention_min_tokens"):
        HFEngineConfig(prefix_attention_min_tokens=-5)
    assert HFEngineConfig().prefix_attention_min_tokens == 64
