"""HFEngine.serve: requests join a running batch between decode steps, results leave as soon as
their sequence ends, and every request samples exactly what it samples alone (fp32, seeded)."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch
from collector_helpers import GoOnEnvironment, make_collector
from conftest import fp32_engine

from environments.tasks.loading import generate_tasks
from grpo.rollout.base import GenerationRequest, RequestFeed, SamplingParams
from grpo.rollout.config import HFEngineConfig

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def model(varied_tiny_model):
    return varied_tiny_model


@pytest.fixture
def prompts(tokenizer):
    return [
        tokenizer.encode("What is 964 * 494?"),  # 9 tokens
        tokenizer.encode("Hi"),  # 1 token
        tokenizer.encode(
            "A much longer prompt, with quite a few more tokens in it than the others have."
        ),  # 19 tokens
        tokenizer.encode(
            "An even longer prompt: it must be longer than the first prompts plus the tokens "
            "sampled so far, so that it moves the batch's write column ahead when it joins."
        ),
    ]


def request(prompt, **sampling) -> GenerationRequest:
    return GenerationRequest(list(prompt), SamplingParams(**sampling))


class ScheduledFeed(RequestFeed):
    """Hands out requests at given `take` calls (one per decode step while rows are live) and
    records when each result came back."""

    def __init__(self, schedule: dict[int, list[GenerationRequest]]) -> None:
        self.schedule = schedule
        self.calls = 0
        self.tickets: list[GenerationRequest] = []
        self.results: dict[int, object] = {}
        self.delivered_at: dict[int, int] = {}
        self.failed: dict[int, Exception] = {}
        self.closed = False

    def take(self, *, close_if_empty: bool, wait_s: float = 0.0):
        later = [call for call in self.schedule if call >= self.calls]
        if close_if_empty and self.calls not in self.schedule:
            if not later:
                self.closed = True
                return []
            self.calls = min(later)  # an idle engine: the next request arrives
        batch = self.schedule.get(self.calls, [])
        self.calls += 1
        taken = [(len(self.tickets) + i, r) for i, r in enumerate(batch)]
        self.tickets += batch
        return taken

    def deliver(self, ticket, result):
        assert ticket not in self.results and ticket not in self.failed
        self.results[ticket] = result
        self.delivered_at[ticket] = self.calls

    def fail(self, ticket, error):
        assert ticket not in self.results and ticket not in self.failed
        self.failed[ticket] = error


def _alone(engine, requests):
    return [engine.generate([r])[0] for r in requests]


def _assert_same(expected, got) -> None:
    assert got.token_ids == expected.token_ids
    assert got.finish_reason == expected.finish_reason
    assert got.behavior_logprobs == pytest.approx(expected.behavior_logprobs, abs=1e-5)


@pytest.mark.parametrize("decode_mode", ["dynamic", "static"])
def test_joining_requests_sample_what_they_sample_alone(model, tokenizer, prompts, decode_mode):
    first = [request(prompts[i % 3], max_new_tokens=6 + 5 * i, seed=i) for i in range(3)]
    group = [request(prompts[1], max_new_tokens=7, seed=10 + k) for k in range(3)]  # shared prefill
    longer = request(prompts[3], max_new_tokens=9, seed=20, temperature=0.7, top_p=0.9)
    greedy = request(prompts[0], max_new_tokens=5, temperature=0.0)
    # Call 4: the group joins (short prompts: right-aligned before the current column).
    # Call 6: a prompt longer than the current column moves it ahead for everyone.
    # Call 40: the batch has drained by then; the request starts a new one.
    schedule = {
        0: first,
        4: group,
        6: [longer, greedy],
        40: [request(prompts[2], max_new_tokens=3, seed=30)],
    }
    engine = fp32_engine(model, tokenizer, decode_mode=decode_mode)
    feed = ScheduledFeed(schedule)
    engine.serve(feed)
    assert feed.closed and not feed.failed
    expected = _alone(fp32_engine(model, tokenizer), feed.tickets)
    assert sorted(feed.results) == list(range(len(feed.tickets)))
    for ticket, want in enumerate(expected):
        _assert_same(want, feed.results[ticket])
    metrics = engine.last_metrics
    assert (metrics["waves"], metrics["joins"], metrics["joined_requests"]) == (2, 2, 5)
    assert metrics["requests"] == len(feed.tickets)
    assert metrics["tokens_generated"] == sum(len(r.token_ids) for r in feed.results.values())
    # Results leave when their sequence ends: the 6-token request long before the 16-token one.
    assert feed.delivered_at[0] == 6 and feed.delivered_at[2] == 16


def test_a_request_that_does_not_fit_waits_for_the_batch_to_drain(model, tokenizer, prompts):
    running = request(prompts[0], max_new_tokens=12, seed=1)
    longer = request(prompts[3], max_new_tokens=4, seed=2)
    after = request(prompts[1], max_new_tokens=4, seed=3)  # fits, but first come, first served
    engine = fp32_engine(model, tokenizer, join_columns=0)
    feed = ScheduledFeed({0: [running], 2: [longer, after]})
    engine.serve(feed)
    assert (engine.last_metrics["waves"], engine.last_metrics["joins"]) == (2, 0)
    assert (
        feed.delivered_at[1] > feed.delivered_at[0] and feed.delivered_at[2] > feed.delivered_at[0]
    )
    expected = _alone(engine, feed.tickets)
    for ticket, want in enumerate(expected):
        _assert_same(want, feed.results[ticket])


def test_full_batch_rows_free_up_for_waiting_requests(model, tokenizer, prompts):
    requests = [request(prompts[i % 3], max_new_tokens=3 + 4 * i, seed=i) for i in range(5)]
    engine = fp32_engine(model, tokenizer, max_batch_size=2, compact_fraction=2.0)
    results = engine.generate(requests)  # 5 requests through 2 rows: each joins as one finishes
    assert engine.last_metrics["waves"] == 1 and engine.last_metrics["joined_requests"] == 3
    for want, got in zip(_alone(engine, requests), results, strict=True):
        _assert_same(want, got)


def test_a_bad_request_fails_alone(model, tokenizer, prompts):
    engine = fp32_engine(model, tokenizer)
    good = request(prompts[0], max_new_tokens=4, seed=1)
    feed = ScheduledFeed(
        {0: [good], 1: [request([], max_new_tokens=4), request(prompts[1], max_new_tokens=0)]}
    )
    engine.serve(feed)
    assert list(feed.failed) == [1] and "empty prompt" in str(feed.failed[1])
    assert feed.results[2].token_ids == [] and feed.results[2].finish_reason == "length"
    _assert_same(engine.generate([good])[0], feed.results[0])
    with pytest.raises(ValueError, match="join_columns\n  Input should be greater than or equal to 0"):
        HFEngineConfig(join_columns=-1)


class ConversationFeed(ScheduledFeed):
    """ScheduledFeed whose first-turn requests (sessions) come back for a second turn, their
    prompt extended by their result and an observation, `delay[session]` take calls after
    their result (the episode's tool call); `observation` may be one per session (a dict)."""

    def __init__(self, schedule, observation: list[int], delay: dict[str, int]) -> None:
        super().__init__(schedule)
        self.observation, self.delay = observation, delay
        self.ended: list[str] = []

    def deliver(self, ticket, result):
        super().deliver(ticket, result)
        request = self.tickets[ticket]
        if request.turn == 0 and request.session in self.delay:
            seen = self.observation
            seen = seen[request.session] if isinstance(seen, dict) else seen
            extended = list(request.prompt_ids) + result.token_ids + seen
            follow = GenerationRequest(
                extended,
                SamplingParams(max_new_tokens=6, seed=100 + ticket),
                session=request.session,
                turn=1,
            )
            self.schedule.setdefault(self.calls + self.delay[request.session], []).append(follow)

    def ended_sessions(self):
        ended, self.ended = self.ended, []
        return ended


@pytest.mark.parametrize(
    "decode_mode,chunk_tokens", [("dynamic", None), ("static", None), ("dynamic", 8)]
)
def test_a_sessions_next_turn_prefills_only_its_new_tokens(
    model, tokenizer, prompts, decode_mode, chunk_tokens
):
    # Sessions a, b, c finish at different steps; a comes back at once, b and c together while
    # d is still decoding (so their rows sit parked through steps that write other rows).
    first = [
        GenerationRequest(
            prompts[i], SamplingParams(max_new_tokens=5 + 3 * i, seed=i), session=name
        )
        for i, name in enumerate("abc")
    ]
    first.append(
        GenerationRequest(prompts[3], SamplingParams(max_new_tokens=30, seed=9), session="d")
    )
    observation = tokenizer.encode(" The tool says 42.")
    engine = fp32_engine(model, tokenizer, decode_mode=decode_mode, prefill_chunk_tokens=chunk_tokens)
    feed = ConversationFeed({0: first}, observation, delay={"a": 0, "b": 9, "c": 6, "d": 0})
    engine.serve(feed)
    assert len(feed.results) == 8
    expected = _alone(fp32_engine(model, tokenizer), feed.tickets)
    for ticket, want in enumerate(expected):
        _assert_same(want, feed.results[ticket])
    metrics = engine.last_metrics
    assert metrics["resumed_requests"] == 4  # every second turn found its session's row
    second_turns = [r for r in feed.tickets if r.turn == 1]
    new_tokens = sum(len(observation) + 1 for _ in second_turns)  # the last token + observation
    shared_first = sum(len(p) for p in prompts[:4])
    assert metrics["prefill_tokens"] <= shared_first + new_tokens


@pytest.mark.parametrize("call_tokens,forwards", [(None, 1), (32, 2)])
def test_turns_resuming_together_split_where_padding_costs_more_than_a_forward(
    model, tokenizer, prompts, call_tokens, forwards
):
    """b comes back with a 60-token observation, c with a 1-token one, in the same step: padding
    c's 2 new tokens to b's 61 costs more than a second forward (32 tokens' worth on a CPU)."""
    first = [GenerationRequest(prompts[i], SamplingParams(max_new_tokens=4, seed=i), session=name)
             for i, name in enumerate("bc")]
    first.append(GenerationRequest(prompts[3], SamplingParams(max_new_tokens=30, seed=9), session="d"))
    observation = {"b": tokenizer.encode(" The tool says 42." * 12)[:60], "c": [13], "d": []}
    engine = fp32_engine(model, tokenizer)
    engine.loop.prefill.prefill_call_tokens = call_tokens
    chunks = []
    real = engine.loop.prefill._resume_chunk
    engine.loop.prefill._resume_chunk = lambda batch, returning, cached: (
        chunks.append(len(returning)), real(batch, returning, cached))
    feed = ConversationFeed({0: first}, observation, delay={"b": 0, "c": 0})
    engine.serve(feed)
    assert engine.last_metrics["resumed_requests"] == 2
    assert chunks == ([2] if forwards == 1 else [1, 1])  # both came back in one step
    expected = _alone(fp32_engine(model, tokenizer), feed.tickets)
    for ticket, want in enumerate(expected):
        _assert_same(want, feed.results[ticket])


@pytest.mark.parametrize("decode_mode", [
    "dynamic", "static",
    pytest.param("graph", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")),
])
def test_a_parked_row_whose_last_token_is_not_in_the_cache_yet(model, tokenizer, prompts, decode_mode):
    # e and f finish at the same step, so no forward feeds their last tokens; e comes back at
    # once and samples while f waits: f's pending last token must survive e's steps.
    first = [  # hot: a token sampled again for f would differ from its last one
        GenerationRequest(
            prompts[i], SamplingParams(max_new_tokens=6, seed=i, temperature=3.0), session=name
        )
        for i, name in enumerate("ef")
    ]
    device = "cuda" if decode_mode == "graph" else None
    engine = fp32_engine(model, tokenizer, device, decode_mode=decode_mode)
    feed = ConversationFeed({0: first}, tokenizer.encode(" next"), delay={"e": 0, "f": 4})
    engine.serve(feed)
    assert engine.last_metrics["resumed_requests"] == 2
    # static and graph: every decode step also drew the next tokens (joined and resumed rows
    # excepted); in a graph, the draws a row keeps must outlive the next replay
    assert engine.last_metrics["steps_with_draws"] == (
        engine.last_metrics["decode_steps"] if decode_mode != "dynamic" else 0
    )
    for ticket, want in enumerate(_alone(engine, feed.tickets)):
        _assert_same(want, feed.results[ticket])


def test_parked_rows_leave_when_sessions_end_or_wait_too_long(model, tokenizer, prompts):
    engine = fp32_engine(model, tokenizer, park_steps=3)
    first = [
        GenerationRequest(prompts[0], SamplingParams(max_new_tokens=4, seed=1), session="a"),
        GenerationRequest(prompts[2], SamplingParams(max_new_tokens=20, seed=2), session="b"),
    ]
    # a's next turn comes 10 steps later: its row waited more than 3 steps and was dropped, so
    # the whole extended prompt is prefilled again -- with the same result.
    feed = ConversationFeed({0: first}, tokenizer.encode(" ok"), delay={"a": 10, "b": 0})
    engine.serve(feed)
    assert engine.last_metrics["resumed_requests"] == 1  # b only
    for ticket, want in enumerate(_alone(engine, feed.tickets)):
        _assert_same(want, feed.results[ticket])
    # Two rows: c needs the row that a's parked turn holds (a's next turn is still far off).
    engine = fp32_engine(model, tokenizer, max_batch_size=2)
    late = GenerationRequest(prompts[1], SamplingParams(max_new_tokens=3, seed=3))
    feed = ConversationFeed({0: first, 6: [late]}, tokenizer.encode(" ok"), delay={"a": 30, "b": 0})
    engine.serve(feed)
    assert feed.delivered_at[2] == 9  # c joined at once: 3 tokens, done long before b's 20
    for ticket, want in enumerate(_alone(engine, feed.tickets)):
        _assert_same(want, feed.results[ticket])
    # A session that ends while its row is still sampling (a cancelled episode) never parks:
    # the engine does not wait `park_wait_s` for a next turn that cannot come.
    engine = fp32_engine(model, tokenizer, park_wait_s=0.5)
    feed = ConversationFeed({0: first[:1]}, [], delay={})
    feed.ended = ["a"]  # reported at the first look, while a's row is live
    engine.serve(feed)
    assert engine.last_metrics["idle_seconds"] == 0 and len(feed.results) == 1
    with pytest.raises(ValueError, match="park_steps\n  Input should be greater than or equal to 0"):
        HFEngineConfig(park_steps=-1)


# -- through the collector ---------------------------------------------------------------------


class SlowFirstToolTurn(GoOnEnvironment):
    """GoOnEnvironment whose first step takes `delay_s` (a slow tool call)."""

    def __init__(self, task, episode_id, delay_s: float):
        super().__init__(task, episode_id)
        self.delay_s = delay_s

    async def step(self, text, *, truncated=False):
        if not self.seen and self.delay_s:
            await asyncio.sleep(self.delay_s)
        return await super().step(text, truncated=truncated)


def _go_on_collector(engine, tokenizer, slow_task=None, **rollout):
    def factory(task, episode_id):
        return SlowFirstToolTurn(task, episode_id, 0.15 if task is slow_task else 0.0)

    return make_collector(
        engine, tokenizer, None, env_factory=factory, max_new_tokens=10, **rollout
    )


def _slow_steps(engine, seconds: float):
    """Each forward of `engine` takes at least `seconds` (a bigger model on a slower device)."""
    real_forward = engine.runner.forward

    def forward(*args, **kwargs):
        time.sleep(seconds)
        return real_forward(*args, **kwargs)

    engine.runner.forward = forward


def test_collector_continuous_batching_gives_the_turn_batched_trajectories(loop, tokenizer, model):
    tasks = generate_tasks("calculator", 3, seed=0)
    results = {}
    for continuous in (True, False):
        engine = fp32_engine(model, tokenizer, continuous_batching=continuous)
        # The first group's first tool call takes 0.15 s; the others' next turns take 0.3 s to
        # generate, so the first group comes back while they are being generated.
        _slow_steps(engine, 0.03)
        collector = _go_on_collector(engine, tokenizer, slow_task=tasks[0])
        results[continuous] = loop.run_until_complete(
            collector.collect(tasks, group_size=2, seed=5)
        )
    joined, batched = results[True], results[False]
    assert [t.token_ids for t in joined.trajectories] == [t.token_ids for t in batched.trajectories]
    for a, b in zip(joined.trajectories, batched.trajectories):
        assert a.num_turns == 3
        assert a.behavior_logprobs == pytest.approx(b.behavior_logprobs, abs=1e-5)
    assert batched.metrics["rollout/joined_requests"] == 0
    assert joined.metrics["rollout/joined_requests"] > 0  # later turns joined a running batch
    assert joined.metrics["rollout/engine_batches"] < batched.metrics["rollout/engine_batches"]
    # Later turns found their episodes' rows: they prefilled only their new tokens.
    assert joined.metrics["rollout/engine_resumed_requests"] > 0
    assert batched.metrics["rollout/engine_resumed_requests"] == 0
    assert (
        joined.metrics["rollout/engine_prefill_tokens"]
        < batched.metrics["rollout/engine_prefill_tokens"]
    )
    # Turn-batched first turns of different tasks share their system prompt's prefill; served
    # ones join a few at a time (here one task's identical prompts per join): nothing to share.
    assert batched.metrics["rollout/engine_shared_prefix_tokens"] > 0
    assert joined.metrics["rollout/engine_shared_prefix_tokens"] == 0


class SlowEveryToolTurn(GoOnEnvironment):
    """GoOnEnvironment whose every step takes `delay_s` (a slow tool)."""

    def __init__(self, task, episode_id, delay_s: float):
        super().__init__(task, episode_id)
        self.delay_s = delay_s

    async def step(self, text, *, truncated=False):
        await asyncio.sleep(self.delay_s)
        return await super().step(text, truncated=truncated)


def test_a_serving_engine_waiting_on_tools_is_not_counted_as_generating(loop, tokenizer, model):
    """One episode, 3 turns, 0.5 s tool steps: after each turn the serve call stays open with the
    episode's row parked, waiting on the feed. That wait is tool time, not generation."""
    engine = fp32_engine(model, tokenizer, park_wait_s=2.0)
    collector = make_collector(
        engine, tokenizer, None, max_new_tokens=4,
        env_factory=lambda task, episode_id: SlowEveryToolTurn(task, episode_id, 0.5),
    )
    result = loop.run_until_complete(
        collector.collect(generate_tasks("calculator", 1, seed=0), group_size=1, seed=0)
    )
    m = result.metrics
    assert result.trajectories[0].num_turns == 3
    assert m["rollout/engine_batches"] == 1  # one serve call for all three turns
    idle = m["rollout/engine_idle_seconds"]
    # A wait through each of the three 0.5 s tool steps (the last one until the episode ends).
    assert 1.4 <= idle <= 2.5
    # Those waits count as tool time, not as generating.
    assert m["rollout/time_in_tools_s"] >= idle - 0.2
    assert m["rollout/time_generating_s"] <= m["rollout/wall_s"] - m["rollout/time_in_tools_s"] + 1e-6
    assert m["rollout/time_generating_s"] + m["rollout/time_in_tools_s"] <= m["rollout/wall_s"] + 1e-6


def test_an_engine_failure_mid_serve_fails_the_waiting_episodes_and_they_retry(
    loop, tokenizer, tiny_model
):
    tasks = generate_tasks("calculator", 2, seed=0)
    engine = fp32_engine(tiny_model, tokenizer)
    real_forward, calls = engine.runner.forward, []

    def failing_forward(*args, **kwargs):
        calls.append(1)
        if len(calls) == 5:
            raise RuntimeError("device lost")
        return real_forward(*args, **kwargs)

    engine.runner.forward = failing_forward
    retried = _go_on_collector(engine, tokenizer)
    result = loop.run_until_complete(retried.collect(tasks, group_size=2, seed=5))
    assert result.failed_episodes == 0 and len(result.trajectories) == 4
    calls.clear()
    no_retries = _go_on_collector(engine, tokenizer, episode_retries=0)
    result = loop.run_until_complete(no_retries.collect(tasks, group_size=2, seed=5))
    assert result.failed_episodes == 4 and result.excluded_groups == 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")
def test_cuda_graph_serve_resumes_sessions_like_dynamic(model, tokenizer, prompts):
    first = [
        GenerationRequest(prompts[i], SamplingParams(max_new_tokens=5 + 3 * i, seed=i), session=s)
        for i, s in enumerate("abc")
    ]
    graph = fp32_engine(model, tokenizer, device="cuda", decode_mode="graph")
    feed = ConversationFeed({0: first}, tokenizer.encode(" ok"), delay={"a": 0, "b": 3, "c": 0})
    graph.serve(feed)
    assert graph.last_metrics["resumed_requests"] == 3
    dynamic = fp32_engine(model, tokenizer, device="cuda", decode_mode="dynamic")
    for ticket, want in enumerate(_alone(dynamic, feed.tickets)):
        _assert_same(want, feed.results[ticket])
