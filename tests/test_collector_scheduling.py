"""TrajectoryCollector scheduling: the requests of live episodes batched, a slow tool call not
holding up the others, the concurrency and total-token bounds, failed episodes retried or their
group excluded, and a cancelled collection closing every environment.

Real parts: the SmolLM2 tokenizer, the bundled calculator MCP server behind the real
SharedToolManager and MCPToolEnvironment. The one fake is `ScriptedEngine`
(tests/collector_helpers.py), a stand-in for the policy that writes fixed texts per turn.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

import pytest
from collector_helpers import (
    ScriptedEngine,
    assert_well_formed,
    make_collector,
    tool_calls_then_answer,
)

import environments  # noqa: F401  (registers mcp_tool)
from environments.config import EnvironmentConfig
from environments.mcp_tool.env import MCPToolEnvironment
from environments.tasks.loading import generate_tasks
from grpo.collect.collector import TrajectoryCollector
from grpo.rollout.config import RolloutConfig


@pytest.fixture(scope="module")
def tasks():
    return generate_tasks("calculator", 3, seed=0)


# -- batching and bounds -----------------------------------------------------------------------


def test_requests_of_all_live_episodes_are_batched(loop, calculator_tools, tasks, tokenizer):
    engine = ScriptedEngine(tokenizer, tasks, tool_calls_then_answer(1))
    collector = make_collector(engine, tokenizer, calculator_tools)
    collector.batch_wait_s = 5.0  # only "everyone has asked" dispatches: deterministic batches
    result = loop.run_until_complete(collector.collect(tasks[:2], group_size=4, seed=0))
    assert len(result.trajectories) == 8
    assert engine.batch_sizes == [8, 8]  # every episode's turn 1, then every episode's turn 2
    assert result.metrics["rollout/mean_batch_size"] == 8.0


def test_slow_tool_call_does_not_hold_up_the_other_episodes(
    loop, calculator_tools, tasks, tokenizer
):
    slow_episode = []

    def factory(task, episode_id):
        env = MCPToolEnvironment(calculator_tools, EnvironmentConfig(), episode_id)
        if not slow_episode:  # the first episode's tool turn takes 1.5 s
            slow_episode.append(episode_id)
            real_step = env.step

            async def step(text, *, truncated=False):
                await asyncio.sleep(1.5)
                return await real_step(text, truncated=truncated)

            env.step = step
        return env

    engine = ScriptedEngine(tokenizer, tasks, tool_calls_then_answer(1), delay_s=0.3)
    collector = TrajectoryCollector(
        engine,
        tokenizer,
        calculator_tools,
        EnvironmentConfig(),
        RolloutConfig(max_new_tokens=64),
        env_factory=factory,
        batch_wait_s=0.4,
        batch_wait_fraction=0.0,
    )
    result = loop.run_until_complete(collector.collect(tasks[:2], group_size=2, seed=0))
    assert len(result.trajectories) == 4
    # Turn 1 of all four; turn 2 of the three fast ones after waiting 0.4 s for the slow one (its
    # tool call overlaps that generation); then the slow one alone.
    assert engine.batch_sizes == [4, 3, 1]
    m = result.metrics
    assert m["rollout/time_tools_overlapped_s"] >= 0.2  # slow tool call during generation
    assert m["rollout/time_in_tools_s"] >= 0.8  # slow tool call with the engine idle
    assert m["rollout/time_generating_s"] >= 0.9  # three engine calls of 0.3 s


class CountingFactory:
    """Builds real MCPToolEnvironments and tracks how many are open at once."""

    def __init__(self, tools, fail=None):
        self.tools = tools
        self.fail = fail or (lambda task, episode_id, calls: False)
        self.open = self.max_open = 0
        self.calls: Counter = Counter()

    def __call__(self, task, episode_id):
        self.calls[task.task_id] += 1
        if self.fail(task, episode_id, self.calls[task.task_id]):
            raise RuntimeError(f"env construction failed for {task.task_id}")
        env = MCPToolEnvironment(self.tools, EnvironmentConfig(), episode_id)
        factory = self
        original_close = env.close

        async def close():
            factory.open -= 1
            await original_close()

        env.close = close
        self.open += 1
        self.max_open = max(self.max_open, self.open)
        return env


def test_concurrency_bound_is_respected(loop, calculator_tools, tasks, tokenizer):
    engine = ScriptedEngine(tokenizer, tasks, tool_calls_then_answer(1))
    factory = CountingFactory(calculator_tools)
    collector = make_collector(
        engine, tokenizer, calculator_tools, env_factory=factory, max_concurrent_episodes=3
    )
    result = loop.run_until_complete(collector.collect(tasks[:2], group_size=4, seed=0))
    assert len(result.trajectories) == 8
    assert factory.max_open == 3 and factory.open == 0
    assert max(engine.batch_sizes) <= 3 and collector.max_live_episodes == 3


def test_max_total_tokens_ends_the_episode_and_shrinks_max_new_tokens(
    loop, calculator_tools, tasks, tokenizer
):
    engine = ScriptedEngine(tokenizer, tasks, tool_calls_then_answer(4))
    probe = make_collector(engine, tokenizer, calculator_tools)
    prompt_len = (
        loop.run_until_complete(probe.collect(tasks[:1], 2, seed=0)).trajectories[0].prompt_length
    )
    budget = prompt_len + 70  # room for about two tool-call turns and their observations
    engine = ScriptedEngine(tokenizer, tasks, tool_calls_then_answer(4))
    collector = make_collector(engine, tokenizer, calculator_tools, max_total_tokens=budget)
    result = loop.run_until_complete(collector.collect(tasks[:1], 2, seed=0))
    assert len(result.trajectories) == 2
    for traj in result.trajectories:
        assert len(traj.token_ids) <= budget
        assert (
            traj.metadata["truncated_total_tokens"]
            and traj.metadata["done_reason"] == "max_total_tokens"
        )
        assert not traj.success and traj.reward < 1.0  # scored as it stands: no answer given
        assert_well_formed(tokenizer, traj)
    for request in engine.requests:
        assert len(request.prompt_ids) + request.sampling.max_new_tokens <= budget
    assert any(r.sampling.max_new_tokens < 64 for r in engine.requests)


# -- failures ----------------------------------------------------------------------------------


def test_episode_failing_once_is_retried_and_kept(loop, calculator_tools, tasks, tokenizer):
    target = tasks[0].task_id
    factory = CountingFactory(
        calculator_tools, fail=lambda task, eid, n: task.task_id == target and n == 1
    )
    engine = ScriptedEngine(tokenizer, tasks, tool_calls_then_answer(1))
    collector = make_collector(
        engine, tokenizer, calculator_tools, env_factory=factory, episode_retries=1
    )
    result = loop.run_until_complete(collector.collect(tasks[:2], group_size=3, seed=0))
    assert result.failed_episodes == 0 and result.excluded_groups == 0
    assert len(result.trajectories) == 6 and all(t.success for t in result.trajectories)
    assert factory.calls[target] == 4  # 3 episodes + 1 retry


def test_group_with_a_failing_episode_is_excluded_whole(
    loop, calculator_tools, tasks, tokenizer, caplog
):
    bad = tasks[1].task_id
    factory = CountingFactory(calculator_tools, fail=lambda task, eid, n: task.task_id == bad)
    engine = ScriptedEngine(tokenizer, tasks, tool_calls_then_answer(1))
    collector = make_collector(
        engine, tokenizer, calculator_tools, env_factory=factory, episode_retries=2
    )
    with caplog.at_level(logging.WARNING, logger="mcp_grpo.collector"):
        result = loop.run_until_complete(collector.collect(tasks[:3], group_size=3, seed=0))
    assert result.excluded_groups == 1 and 1 <= result.failed_episodes <= 3
    assert result.metrics["rollout/excluded_groups"] == 1.0
    assert [t.task_id for t in result.trajectories] == [tasks[0].task_id] * 3 + [
        tasks[2].task_id
    ] * 3
    assert all(t.success for t in result.trajectories)
    assert any(
        bad in r.getMessage() and "env construction failed" in r.getMessage()
        for r in caplog.records
    )
    assert result.errors and bad in result.errors[0]


def test_env_step_exception_excludes_only_that_group(loop, calculator_tools, tasks, tokenizer):
    bad = tasks[0].task_id

    def factory(task, episode_id):
        env = MCPToolEnvironment(calculator_tools, EnvironmentConfig(), episode_id)
        if task.task_id == bad:

            async def step(text, *, truncated=False):
                raise ConnectionError("tool layer went away")

            env.step = step
        return env

    engine = ScriptedEngine(tokenizer, tasks, tool_calls_then_answer(1))
    collector = make_collector(
        engine, tokenizer, calculator_tools, env_factory=factory, episode_retries=0
    )
    result = loop.run_until_complete(collector.collect(tasks[:2], group_size=2, seed=0))
    assert result.excluded_groups == 1
    assert [t.task_id for t in result.trajectories] == [tasks[1].task_id] * 2


def test_engine_failure_retries_the_episodes_of_that_batch(
    loop, calculator_tools, tasks, tokenizer
):
    engine = ScriptedEngine(tokenizer, tasks, tool_calls_then_answer(1), fail_batches=1)
    collector = make_collector(engine, tokenizer, calculator_tools, episode_retries=1)
    result = loop.run_until_complete(collector.collect(tasks[:2], group_size=2, seed=0))
    assert result.failed_episodes == 0 and len(result.trajectories) == 4
    assert all(t.success for t in result.trajectories)


class OutOfMemoryEngine(ScriptedEngine):
    def generate(self, requests):
        self.batch_sizes.append(len(requests))
        raise MemoryError


def test_running_out_of_memory_stops_the_collection_without_a_line_per_episode(
    loop, calculator_tools, tasks, tokenizer, caplog
):
    # A MemoryError is the process's, not one episode's: retrying each episode only repeated it,
    # one log line per episode.
    engine = OutOfMemoryEngine(tokenizer, tasks, tool_calls_then_answer(1))
    collector = make_collector(engine, tokenizer, calculator_tools, episode_retries=2)
    with caplog.at_level(logging.INFO, logger="mcp_grpo"), pytest.raises(MemoryError):
        loop.run_until_complete(collector.collect(tasks[:2], group_size=4, seed=0))
    assert engine.batch_sizes == [8]  # one engine call, never retried
    assert [r.getMessage() for r in caplog.records if "failed" in r.getMessage()] == []


def test_cancelled_collection_closes_every_environment(loop, calculator_tools, tasks, tokenizer):
    engine = ScriptedEngine(tokenizer, tasks, tool_calls_then_answer(1), delay_s=0.3)
    factory = CountingFactory(calculator_tools)
    collector = make_collector(engine, tokenizer, calculator_tools, env_factory=factory)

    async def cancel_mid_way():
        collecting = asyncio.ensure_future(collector.collect(tasks[:2], group_size=2, seed=0))
        await asyncio.sleep(0.15)  # inside the first engine call
        collecting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await collecting

    loop.run_until_complete(asyncio.wait_for(cancel_mid_way(), 10))
    assert factory.max_open == 4 and factory.open == 0
    assert engine.batch_sizes == [4]  # the cancelled episodes' requests are never generated
