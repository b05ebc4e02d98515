"""HFEngine's decode steps that draw the next tokens themselves (`sample_in_decode_step`), and
requests that wait a few decode steps to join a running batch together (`join_wait_steps`)."""

from __future__ import annotations

import pytest
import torch
from conftest import fp32_engine
from test_continuous_batching import ScheduledFeed, _alone, _assert_same
from test_rollout_hf import _assert_same_results, _seeded_requests, request

from grpo.config import load_config
from grpo.rollout.config import HFEngineConfig
from grpo.rollout.hf.engine import HFEngine
from grpo.rollout.hf.kv_cache import PreallocatedCache
from grpo.rollout.hf.live_batch import LiveBatch
from grpo.rollout.hf.sequence import Joiner
from grpo.rollout.registry import make_engine

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def model(varied_tiny_model):
    return varied_tiny_model  # tests/conftest.py: O(1) weights, varied continuations


@pytest.fixture
def prompts(tokenizer):
    texts = ("Add 17 and 25.", "Yes", "Please tell me, in a few words, what the tool answered just now.",
             ("This prompt is the longest of the four, long enough that when it joins a running batch it "
              "has to move the column that the next decode step writes to further to the right."))
    return [tokenizer.encode(text) for text in texts]


def test_static_steps_draw_the_tokens_the_sampler_draws_after_them(model, tokenizer, prompts):
    requests = _seeded_requests(prompts, 5) + _seeded_requests(prompts, 2, temperature=0.0)
    requests += _seeded_requests(prompts, 2, temperature=0.7)
    after = fp32_engine(model, tokenizer, decode_mode="static", sample_in_decode_step=False)
    inside = fp32_engine(model, tokenizer, decode_mode="static")
    static = load_config(None, ["device=cpu", "rollout.hf.decode_mode=static"])
    assert inside.settings.sample_in_decode_step and make_engine(
        "hf", policy=model, tokenizer=tokenizer, config=static).settings.sample_in_decode_step
    expected = after.generate(requests)
    _assert_same_results(expected, inside.generate(requests))
    assert after.last_metrics["steps_with_draws"] == 0
    assert inside.last_metrics["steps_with_draws"] == inside.last_metrics["decode_steps"] > 0
    # A nucleus row is sampled after the step: steps run without draws while it is live.
    nucleus = requests[:2] + [request(prompts[1], max_new_tokens=6, seed=7, top_p=0.8)]
    _assert_same_results(after.generate(nucleus), inside.generate(nucleus))
    metrics = inside.last_metrics
    assert 0 < metrics["steps_with_draws"] < metrics["decode_steps"]


def test_a_graph_steps_draws_survive_its_next_replay(model, tokenizer, prompts):
    # A CUDA graph's outputs are static buffers: the next replay overwrites the draws the batch
    # was handed. Stand-in: a step hands over buffers, which are overwritten after sampling.
    batch = LiveBatch(PreallocatedCache(2, 2, 64, zero_columns=0), 2, torch.device("cpu"))
    batch.pos = 10
    joiners = [Joiner(t, request(prompts[0][:5], max_new_tokens=8, seed=t), t) for t in range(2)]
    vocab = model.config.vocab_size
    batch.append(joiners, torch.zeros(2, vocab))
    batch.sample(tokenizer, lambda row, result: None)
    tokens, logprobs = torch.tensor([5, 6]), torch.tensor([-1.0, -2.0])
    batch.advance(torch.zeros(2, vocab), [True, True], (tokens, logprobs))
    batch.sample(tokenizer, lambda row, result: None)
    assert [row.tokens[-1] for row in batch.rows] == [5, 6]
    tokens.copy_(torch.tensor([7, 8]))  # the graph's next replay
    assert batch.tokens.tolist() == [5, 6]


def test_requests_joining_a_running_batch_wait_a_few_steps_to_join_together(model, tokenizer, prompts):
    def schedule():
        return {
            0: [request(prompts[0], max_new_tokens=20, seed=1)],
            3: [request(prompts[1], max_new_tokens=5, seed=2)],
            4: [request(prompts[2], max_new_tokens=5, seed=3)],
            5: [request(prompts[3], max_new_tokens=5, seed=4)],
        }

    at_once = fp32_engine(model, tokenizer, join_wait_steps=0)
    eager_feed = ScheduledFeed(schedule())
    at_once.serve(eager_feed)
    assert (at_once.last_metrics["joins"], at_once.last_metrics["joined_requests"]) == (3, 3)
    patient = fp32_engine(model, tokenizer, join_wait_steps=2)
    feed = ScheduledFeed(schedule())
    patient.serve(feed)
    # The request of step 3 waits two steps and joins with those of steps 4 and 5: one prefill.
    assert (patient.last_metrics["joins"], patient.last_metrics["joined_requests"]) == (1, 3)
    assert [feed.delivered_at[t] - eager_feed.delivered_at[t] for t in range(4)] == [0, 2, 1, 0]
    for ticket, want in enumerate(_alone(at_once, feed.tickets)):
        _assert_same(want, feed.results[ticket])
        _assert_same(want, eager_feed.results[ticket])
    # generate's requests beyond the batch join as rows free up, at once
    waves = fp32_engine(model, tokenizer, max_batch_size=1, join_wait_steps=5)
    two = [request(prompts[0], max_new_tokens=3, seed=1), request(prompts[1], max_new_tokens=3, seed=2)]
    waves.generate(two)
    assert waves.last_metrics["decode_steps"] == 4  # 2 + 2: no step without a live row
    with pytest.raises(ValueError, match="join_wait_steps\n  Input should be greater than or equal to 0"):
        HFEngineConfig(join_wait_steps=-1)
    # One default: null is 0 on a CPU and 4 on CUDA, for an engine built with or without a config.
    assert HFEngine(model, tokenizer).settings.join_wait_steps == 0
    assert HFEngineConfig().for_device("cuda").join_wait_steps == 4
