"""Prompts that join together and start alike prefill their common prefix once (grpo/rollout/
prefill.py `shared_prefix_length`, decode_loop.py `_prefill_shared`): every request still samples
exactly what it samples with its prompt prefilled whole (fp32, seeded), in `generate`, in waves,
after compaction and in `serve` with sessions coming back; the prefill forwards run fewer tokens."""

from __future__ import annotations

import pytest
import torch
from conftest import fp32_engine
from test_continuous_batching import ConversationFeed, ScheduledFeed, _alone, _assert_same

from grpo.rollout.base import GenerationRequest, SamplingParams
from grpo.rollout.config import HFEngineConfig
from grpo.rollout.hf.prefill import shared_prefix_length

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def model(varied_tiny_model):
    return varied_tiny_model


@pytest.fixture
def prefix(tokenizer):
    return tokenizer.encode(
        "You are a careful calculator. Use the tools you are given, one call at a time, and "
        "answer with the number only."
    )


@pytest.fixture
def prompts(tokenizer, prefix):
    tails = [
        " What is 964 * 494?",
        " Hi",
        " A much longer question, with quite a few more tokens in it than the others have.",
    ]
    prompts = [prefix + tokenizer.encode(tail) for tail in tails]
    # The tails differ at their first token: the common prefix is exactly `prefix`.
    assert len({p[len(prefix)] for p in prompts}) == 3
    return prompts


def request(prompt, **sampling) -> GenerationRequest:
    return GenerationRequest(list(prompt), SamplingParams(**sampling))


def test_shared_prefix_length_is_the_common_prefix_short_of_the_shortest_prompt():
    a, b, c = (1, 2, 3, 4, 5, 6), (1, 2, 3, 4, 9), (1, 2, 3, 7, 7, 7, 7)
    assert shared_prefix_length([a, b], 1) == 4
    assert shared_prefix_length([a, b, c], 1) == 3
    assert shared_prefix_length([c, b, a], 1) == 3  # any order
    # A prompt that is a prefix of another keeps its last token for its own row.
    assert shared_prefix_length([a, a[:3]], 1) == 2
    assert shared_prefix_length([a, (1,)], 1) == 0
    # Sharing must save at least min_saved_tokens: prefix x (prompts - 1) = 3 x 2 = 6.
    assert shared_prefix_length([a, b, c], 6) == 3
    assert shared_prefix_length([a, b, c], 7) == 0
    assert shared_prefix_length([a, b, c], 0) == 0  # 0: never
    assert shared_prefix_length([a], 1) == 0
    assert shared_prefix_length([a, (9, 2, 3, 4)], 1) == 0


def _requests(prompts):
    return [
        request(prompts[0], max_new_tokens=9, seed=1),
        *[request(prompts[1], max_new_tokens=6 + k, seed=10 + k) for k in range(3)],  # a group
        request(prompts[2], max_new_tokens=12, seed=2, temperature=0.7, top_p=0.9),
        request(prompts[0], max_new_tokens=5, temperature=0.0),  # greedy
    ]


@pytest.mark.parametrize(
    "decode_mode,chunk_tokens", [("dynamic", None), ("static", None), ("dynamic", 40)]
)
def test_prompts_that_start_alike_sample_what_they_sample_prefilled_whole(
    model, tokenizer, prompts, prefix, decode_mode, chunk_tokens
):
    requests = _requests(prompts)
    whole = fp32_engine(model, tokenizer, shared_prefix_min_tokens=0)
    expected = whole.generate(requests)
    assert whole.last_metrics["shared_prefix_tokens"] == 0
    assert whole.last_metrics["prefill_tokens"] == sum(len(p) for p in prompts)
    engine = fp32_engine(model, tokenizer, shared_prefix_min_tokens=1, decode_mode=decode_mode,
                         prefill_chunk_tokens=chunk_tokens)
    got = engine.generate(requests)
    for want, result in zip(expected, got):
        _assert_same(want, result)
    rests = sum(len(p) - len(prefix) for p in prompts)
    assert engine.last_metrics["prefill_tokens"] == len(prefix) + rests
    assert engine.last_metrics["shared_prefix_tokens"] == 2 * len(prefix)  # 3 distinct prompts


def test_a_shared_prefix_gives_the_uncached_greedy_continuation(model, tokenizer, prompts):
    engine = fp32_engine(model, tokenizer, shared_prefix_min_tokens=1)
    results = engine.generate([request(p, temperature=0.0, max_new_tokens=8) for p in prompts])
    assert engine.last_metrics["shared_prefix_tokens"] > 0
    with torch.no_grad():
        for prompt, result in zip(prompts, results):
            ids = list(prompt)
            for _ in range(8):
                ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
            assert result.token_ids == ids[len(prompt) :]


def test_waves_and_compaction_keep_shared_prefix_rows_exact(model, tokenizer, prompts):
    requests = [
        request(prompts[i % 3], max_new_tokens=4 + 3 * i, seed=i, stop_token_ids=(2,))
        for i in range(7)
    ]
    expected = fp32_engine(model, tokenizer, shared_prefix_min_tokens=0).generate(requests)
    # Two rows at a time: later requests join the running batch as rows finish and compact away.
    engine = fp32_engine(model, tokenizer, shared_prefix_min_tokens=1, max_batch_size=2, compact_fraction=0.0)
    got = engine.generate(requests)
    for want, result in zip(expected, got):
        _assert_same(want, result)
    assert engine.last_metrics["shared_prefix_tokens"] > 0
    assert engine.last_metrics["compactions"] > 0


def test_served_sessions_with_a_shared_prefix_come_back_exactly(model, tokenizer, prompts):
    # Three sessions start together (their prefix prefilled once); two more prompts join the
    # running batch, one of them decoding long enough to keep the batch alive; each session's
    # second turn resumes its own row (the prefix and the gap of a shorter prompt stay in place).
    first = [
        GenerationRequest(prompts[i], SamplingParams(max_new_tokens=5 + 3 * i, seed=i), session=s)
        for i, s in enumerate("abc")
    ]
    joining = [
        request(prompts[1], max_new_tokens=30, seed=20),
        request(prompts[2], max_new_tokens=4, seed=21),
    ]
    observation = tokenizer.encode(" The tool says 42.")
    engine = fp32_engine(model, tokenizer, shared_prefix_min_tokens=1)
    feed = ConversationFeed({0: first, 3: joining}, observation, delay={"a": 0, "b": 4, "c": 1})
    engine.serve(feed)
    assert len(feed.results) == 8 and not feed.failed
    expected = _alone(fp32_engine(model, tokenizer), feed.tickets)
    for ticket, want in enumerate(expected):
        _assert_same(want, feed.results[ticket])
    metrics = engine.last_metrics
    assert metrics["resumed_requests"] == 3
    assert metrics["shared_prefix_tokens"] > 0


def test_serve_without_sessions_joins_alike_prompts_into_a_running_batch(model, tokenizer, prompts):
    schedule = {0: [request(prompts[2], max_new_tokens=20, seed=0)], 5: _requests(prompts)}
    engine = fp32_engine(model, tokenizer, shared_prefix_min_tokens=1)
    feed = ScheduledFeed(schedule)
    engine.serve(feed)
    expected = _alone(fp32_engine(model, tokenizer), feed.tickets)
    for ticket, want in enumerate(expected):
        _assert_same(want, feed.results[ticket])
    assert engine.last_metrics["joins"] == 1
    assert engine.last_metrics["shared_prefix_tokens"] > 0


def test_shared_prefix_min_tokens_is_checked(model, tokenizer):
    with pytest.raises(ValueError, match="shared_prefix_min_tokens\n  Input should be greater than or equal to 0"):
        HFEngineConfig(shared_prefix_min_tokens=-1)
    with pytest.raises(ValueError, match="shared_prefix_min_tokens"):
        HFEngineConfig(shared_prefix_min_tokens=-5)
    assert HFEngineConfig().shared_prefix_min_tokens == 64
