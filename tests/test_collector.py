"""TrajectoryCollector: token-exact trajectories, batching, failures, bounds.

Real parts: the SmolLM2 tokenizer, the bundled calculator MCP server behind the real
SharedToolManager, MCPToolEnvironment, and (in one test) the tiny model with the real HFEngine.
The one fake is `ScriptedEngine`, a stand-in for the policy that writes fixed texts per turn.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
import time
from collections import Counter

import pytest
import torch
from conftest import mask_runs, running_manager

import environments  # noqa: F401  (registers mcp_tool)
from environments.base import StepResult
from environments.config import EnvironmentConfig
from environments.mcp_tool.env import MCPToolEnvironment
from environments.tasks.loading import generate_tasks
from grpo.collect import chat_tokens
from grpo.collect.collector import TrajectoryCollector, turn_seed
from grpo.rollout.base import GenerationResult, RolloutEngine
from grpo.rollout.config import RolloutConfig
from grpo.rollout.hf import HFEngine

# -- fixtures ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tools(loop):
    with running_manager(loop, "calculator") as manager:
        yield manager


@pytest.fixture(scope="module")
def tasks():
    return generate_tasks("calculator", 3, seed=0)


def _expression(task) -> str:
    return task.extra_info["expression"]


def _answer(task):
    return task.reward_spec.ground_truth.success.answer


def _call(expression: str) -> str:
    call = json.dumps({"name": "calculate", "arguments": {"expression": expression}})
    return f"<tool_call>\n{call}\n</tool_call>"


# -- the scripted policy -----------------------------------------------------------------------


def scripted_logprob(turn: int, index: int, token: int) -> float:
    """A distinct log-prob per (turn, position in turn, token): lets a test check placement."""
    return -(turn + 1) - index / 1000 - token / 1e8


class ScriptedEngine(RolloutEngine):
    """Writes `script(expression, answer, turn) -> (text, ended)` for the task found in the prompt;
    `ended` appends <|im_end|>. Records every batch and request."""

    def __init__(self, tokenizer, tasks, script, *, fail_batches: int = 0, delay_s: float = 0.0):
        self.tokenizer = tokenizer
        self.answers = {_expression(t): _answer(t) for t in tasks}
        self.script = script
        self.eot = chat_tokens.end_of_turn_id(tokenizer)
        self.fail_batches = fail_batches
        self.delay_s = delay_s
        self.batch_sizes: list[int] = []
        self.requests = []
        self._lock = threading.Lock()

    def turn_ids(self, expression: str, turn: int) -> list[int]:
        text, ended = self.script(expression, self.answers[expression], turn)
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return ids + ([self.eot] if ended else [])

    def generate(self, requests):
        with self._lock:
            self.batch_sizes.append(len(requests))
            self.requests.extend(requests)
            if self.fail_batches > 0:
                self.fail_batches -= 1
                raise RuntimeError("scripted engine failure")
        time.sleep(self.delay_s)
        results = []
        for request in requests:
            prompt = self.tokenizer.decode(request.prompt_ids)
            # The task's question is the last user message (worked examples come before it).
            task_part = prompt[prompt.rindex("<|im_start|>user\n"):]
            expression = re.match(r"<\|im_start\|>user\nWhat is (.+?)\?", task_part).group(1)
            turn = task_part.count("<|im_start|>assistant\n") - 1
            ids = self.turn_ids(expression, turn)
            finish = "stop" if ids and ids[-1] in request.sampling.stop_token_ids else "length"
            if len(ids) > request.sampling.max_new_tokens:
                ids, finish = ids[: request.sampling.max_new_tokens], "length"
            logprobs = [scripted_logprob(turn, i, tok) for i, tok in enumerate(ids)]
            results.append(GenerationResult(ids, logprobs, finish))
        return results

    def sync_weights(self, policy) -> None:
        pass


def tool_calls_then_answer(calls: int, *, end_tool_turns: bool = True):
    def script(expression, answer, turn):
        if turn < calls:
            return _call(expression), end_tool_turns
        return f"<answer>{answer}</answer>", True

    return script


def make_collector(engine, tokenizer, tools, *, env_factory=None, **rollout):
    rollout.setdefault("max_new_tokens", 64)
    return TrajectoryCollector(
        engine,
        tokenizer,
        tools,
        EnvironmentConfig(),
        RolloutConfig(**rollout),
        env_factory=env_factory,
    )


# -- helpers to check trajectories ------------------------------------------------------------


def _encode(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def rebuild_from_transcript(tokenizer, traj) -> list[int]:
    """The trajectory's ids rebuilt independently: prompt, then per turn the sampled ids and the
    observation delta of the messages that followed it in the transcript."""
    transcript = traj.metadata["transcript"]
    prompt_messages = traj.metadata["prompt_messages"]
    ids = chat_tokens.prompt_ids(tokenizer, transcript[:prompt_messages])
    runs = mask_runs(traj.loss_mask)
    assistant_at = [i for i, m in enumerate(transcript) if m["role"] == "assistant" and i >= prompt_messages]
    eot = chat_tokens.end_of_turn_id(tokenizer)
    for turn, (start, end) in enumerate(runs):
        sampled = traj.token_ids[start:end]
        ids += sampled
        if turn + 1 < len(runs):
            observations = transcript[assistant_at[turn] + 1 : assistant_at[turn + 1]]
            ids += chat_tokens.observation_delta_ids(
                tokenizer, observations, assistant_ended=sampled[-1] == eot
            )
    return ids


def assert_well_formed(tokenizer, traj):
    n = len(traj.token_ids)
    assert len(traj.loss_mask) == n and len(traj.behavior_logprobs) == n
    assert set(traj.loss_mask) <= {0, 1}
    assert sum(traj.loss_mask[: traj.prompt_length]) == 0
    assert len(mask_runs(traj.loss_mask)) == traj.num_turns == len(traj.finish_reasons)
    for m, lp in zip(traj.loss_mask, traj.behavior_logprobs):
        assert (lp <= 0.0) if m else (lp == 0.0)
    assert rebuild_from_transcript(tokenizer, traj) == traj.token_ids


# -- token in, token out -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "calls,end_tool_turns",
    [(0, True), (1, True), (4, True), (1, False)],
    ids=["1-turn", "2-turn", "5-turn", "2-turn-first-cut-off"],
)
def test_trajectory_is_prompt_plus_sampled_plus_observation_deltas(
    loop, tools, tasks, tokenizer, calls, end_tool_turns
):
    engine = ScriptedEngine(
        tokenizer, tasks, tool_calls_then_answer(calls, end_tool_turns=end_tool_turns)
    )
    collector = make_collector(engine, tokenizer, tools)
    result = loop.run_until_complete(collector.collect(tasks[:2], group_size=2, seed=0))
    assert result.failed_episodes == 0 and result.excluded_groups == 0
    assert len(result.trajectories) == 4
    eot = chat_tokens.end_of_turn_id(tokenizer)
    for traj in result.trajectories:
        transcript = traj.metadata["transcript"]
        task = next(t for t in tasks if t.task_id == traj.task_id)
        assert traj.num_turns == calls + 1 and traj.num_tool_calls == calls
        # Answering without the calculator gets the answer reward but fails must_call_tool.
        assert traj.metadata["reward_breakdown"]["final_answer"] == 1.0
        assert traj.success == (calls > 0) and traj.reward == (1.0 if calls else 0.5)

        # The whole sequence is exactly the chat template of the transcript, tokenized at once
        # (ChatML makes this exact); the template's "\n" after the last <|im_end|> was not sampled.
        full = _encode(tokenizer, tokenizer.apply_chat_template(transcript, tokenize=False))
        assert traj.token_ids + _encode(tokenizer, "\n") == full

        # Prompt ids, then each turn's sampled ids (mask 1) and the observation deltas (mask 0).
        prompt_messages = traj.metadata["prompt_messages"]
        assert transcript[prompt_messages - 1]["role"] == "user"  # the task's question ends the prompt
        assert traj.prompt_length == len(
            chat_tokens.prompt_ids(tokenizer, transcript[:prompt_messages])
        )
        runs = mask_runs(traj.loss_mask)
        assert len(runs) == calls + 1
        for turn, (start, end) in enumerate(runs):
            assert traj.token_ids[start:end] == engine.turn_ids(_expression(task), turn)
            assert traj.behavior_logprobs[start:end] == [
                scripted_logprob(turn, i, tok) for i, tok in enumerate(traj.token_ids[start:end])
            ]
        assert sum(traj.loss_mask) == sum(end - start for start, end in runs)
        assert all(lp == 0.0 for m, lp in zip(traj.loss_mask, traj.behavior_logprobs) if not m)
        assert rebuild_from_transcript(tokenizer, traj) == traj.token_ids

        # The environment saw the decoded sampled text; a cut-off turn is closed by the delta.
        assistant_texts = [m["content"] for m in transcript[prompt_messages:] if m["role"] == "assistant"]
        assert assistant_texts == [
            tokenizer.decode(traj.token_ids[s:e], skip_special_tokens=True) for s, e in runs
        ]
        if not end_tool_turns:
            start, end = runs[0]
            assert traj.token_ids[end - 1] != eot and traj.token_ids[end] == eot
            assert traj.finish_reasons[0] == "length"
            assert traj.metadata["counts"]["truncated_turns"] == 1


def test_metrics_and_metadata(loop, tools, tasks, tokenizer):
    engine = ScriptedEngine(tokenizer, tasks, tool_calls_then_answer(1))
    result = loop.run_until_complete(
        make_collector(engine, tokenizer, tools).collect(tasks[:2], 2, seed=0)
    )
    m = result.metrics
    assert m["rollout/turns_per_episode"] == 2.0
    assert m["rollout/tool_calls_per_episode"] == 1.0
    assert (
        m["rollout/success_rate"] == 1.0
        and m["rollout/reward_mean"] == 1.0
        and m["rollout/reward_std"] == 0.0
    )
    assert m["rollout/parse_failure_rate"] == 0.0 and m["rollout/tool_error_rate"] == 0.0
    assert m["rollout/engine_batches"] == len(engine.batch_sizes)
    assert m["rollout/mean_batch_size"] == sum(engine.batch_sizes) / len(engine.batch_sizes)
    assert m["rollout/gen_tokens"] == sum(t.num_generated_tokens for t in result.trajectories)
    assert m["rollout/traj_len_max"] == max(len(t.token_ids) for t in result.trajectories)
    assert m["rollout/time_generating_s"] > 0 and m["rollout/time_in_tools_s"] > 0
    assert (
        m["rollout/time_generating_s"] + m["rollout/time_in_tools_s"] <= m["rollout/wall_s"] + 1e-6
    )
    assert all(k.startswith("rollout/") for k in m)
    traj = result.trajectories[0]
    assert traj.metadata["reward_breakdown"] == {"final_answer": 1.0, "must_call_tool": 1.0}
    assert traj.finish_reasons == ["stop", "stop"] and traj.turn_rewards == []
    assert [g for g in (t.group_id for t in result.trajectories)] == [
        result.trajectories[0].group_id
    ] * 2 + [result.trajectories[2].group_id] * 2


# -- batching and bounds -----------------------------------------------------------------------


def test_requests_of_all_live_episodes_are_batched(loop, tools, tasks, tokenizer):
    engine = ScriptedEngine(tokenizer, tasks, tool_calls_then_answer(1))
    collector = make_collector(engine, tokenizer, tools)
    collector.batch_wait_s = 5.0  # only "everyone has asked" dispatches: deterministic batches
    result = loop.run_until_complete(collector.collect(tasks[:2], group_size=4, seed=0))
    assert len(result.trajectories) == 8
    assert engine.batch_sizes == [8, 8]  # every episode's turn 1, then every episode's turn 2
    assert result.metrics["rollout/mean_batch_size"] == 8.0


def test_slow_tool_call_does_not_hold_up_the_other_episodes(loop, tools, tasks, tokenizer):
    slow_episode = []

    def factory(task, episode_id):
        env = MCPToolEnvironment(tools, EnvironmentConfig(), episode_id)
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
        tools,
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


def test_concurrency_bound_is_respected(loop, tools, tasks, tokenizer):
    engine = ScriptedEngine(tokenizer, tasks, tool_calls_then_answer(1))
    factory = CountingFactory(tools)
    collector = make_collector(
        engine, tokenizer, tools, env_factory=factory, max_concurrent_episodes=3
    )
    result = loop.run_until_complete(collector.collect(tasks[:2], group_size=4, seed=0))
    assert len(result.trajectories) == 8
    assert factory.max_open == 3 and factory.open == 0
    assert max(engine.batch_sizes) <= 3 and collector.max_live_episodes == 3


def test_max_total_tokens_ends_the_episode_and_shrinks_max_new_tokens(
    loop, tools, tasks, tokenizer
):
    engine = ScriptedEngine(tokenizer, tasks, tool_calls_then_answer(4))
    probe = make_collector(engine, tokenizer, tools)
    prompt_len = (
        loop.run_until_complete(probe.collect(tasks[:1], 2, seed=0)).trajectories[0].prompt_length
    )
    budget = prompt_len + 70  # room for about two tool-call turns and their observations
    engine = ScriptedEngine(tokenizer, tasks, tool_calls_then_answer(4))
    collector = make_collector(engine, tokenizer, tools, max_total_tokens=budget)
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


def test_episode_failing_once_is_retried_and_kept(loop, tools, tasks, tokenizer):
    target = tasks[0].task_id
    factory = CountingFactory(tools, fail=lambda task, eid, n: task.task_id == target and n == 1)
    engine = ScriptedEngine(tokenizer, tasks, tool_calls_then_answer(1))
    collector = make_collector(engine, tokenizer, tools, env_factory=factory, episode_retries=1)
    result = loop.run_until_complete(collector.collect(tasks[:2], group_size=3, seed=0))
    assert result.failed_episodes == 0 and result.excluded_groups == 0
    assert len(result.trajectories) == 6 and all(t.success for t in result.trajectories)
    assert factory.calls[target] == 4  # 3 episodes + 1 retry


def test_group_with_a_failing_episode_is_excluded_whole(loop, tools, tasks, tokenizer, caplog):
    bad = tasks[1].task_id
    factory = CountingFactory(tools, fail=lambda task, eid, n: task.task_id == bad)
    engine = ScriptedEngine(tokenizer, tasks, tool_calls_then_answer(1))
    collector = make_collector(engine, tokenizer, tools, env_factory=factory, episode_retries=2)
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


def test_env_step_exception_excludes_only_that_group(loop, tools, tasks, tokenizer):
    bad = tasks[0].task_id

    def factory(task, episode_id):
        env = MCPToolEnvironment(tools, EnvironmentConfig(), episode_id)
        if task.task_id == bad:

            async def step(text, *, truncated=False):
                raise ConnectionError("tool layer went away")

            env.step = step
        return env

    engine = ScriptedEngine(tokenizer, tasks, tool_calls_then_answer(1))
    collector = make_collector(engine, tokenizer, tools, env_factory=factory, episode_retries=0)
    result = loop.run_until_complete(collector.collect(tasks[:2], group_size=2, seed=0))
    assert result.excluded_groups == 1
    assert [t.task_id for t in result.trajectories] == [tasks[1].task_id] * 2


def test_engine_failure_retries_the_episodes_of_that_batch(loop, tools, tasks, tokenizer):
    engine = ScriptedEngine(tokenizer, tasks, tool_calls_then_answer(1), fail_batches=1)
    collector = make_collector(engine, tokenizer, tools, episode_retries=1)
    result = loop.run_until_complete(collector.collect(tasks[:2], group_size=2, seed=0))
    assert result.failed_episodes == 0 and len(result.trajectories) == 4
    assert all(t.success for t in result.trajectories)


def test_cancelled_collection_closes_every_environment(loop, tools, tasks, tokenizer):
    engine = ScriptedEngine(tokenizer, tasks, tool_calls_then_answer(1), delay_s=0.3)
    factory = CountingFactory(tools)
    collector = make_collector(engine, tokenizer, tools, env_factory=factory)

    async def cancel_mid_way():
        collecting = asyncio.ensure_future(collector.collect(tasks[:2], group_size=2, seed=0))
        await asyncio.sleep(0.15)  # inside the first engine call
        collecting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await collecting

    loop.run_until_complete(asyncio.wait_for(cancel_mid_way(), 10))
    assert factory.max_open == 4 and factory.open == 0
    assert engine.batch_sizes == [4]  # the cancelled episodes' requests are never generated


# -- seeds ---------------------------------------------------------------------------------------


def test_turn_seeds_are_deterministic_and_distinct():
    assert turn_seed(None, 0, "t", 0, 0) is None
    assert turn_seed(1, 2, "t", 3, 4) == turn_seed(1, 2, "t", 3, 4)
    seeds = {
        turn_seed(1, step, task, k, turn)
        for step in (0, 1)
        for task in ("a", "b")
        for k in range(4)
        for turn in range(3)
    }
    assert len(seeds) == 2 * 2 * 4 * 3
    assert all(0 <= s < 2**62 for s in seeds)


# -- the real engine -----------------------------------------------------------------------------


def test_real_hf_engine_end_to_end(loop, tools, tasks, tokenizer, tiny_model):
    engine = HFEngine(tiny_model, tokenizer, dtype=torch.float32, max_batch_size=16)
    collector = make_collector(engine, tokenizer, tools, max_new_tokens=12)

    def run():
        return loop.run_until_complete(
            collector.collect(tasks[:2], group_size=3, seed=123, temperature=1.0)
        )

    result = run()
    assert result.failed_episodes == 0 and len(result.trajectories) == 6
    groups = [t.group_id for t in result.trajectories]
    assert (
        groups[:3] == [groups[0]] * 3 and groups[3:] == [groups[3]] * 3 and groups[0] != groups[3]
    )
    for traj in result.trajectories:
        assert_well_formed(tokenizer, traj)
        assert 1 <= traj.num_turns and all(r in ("stop", "length") for r in traj.finish_reasons)
        for start, end in mask_runs(traj.loss_mask):
            assert end - start <= 12
    # The samples of a group differ; a seeded run reproduces exactly.
    assert len({tuple(t.token_ids) for t in result.trajectories[:3]}) > 1
    again = run()
    assert [t.token_ids for t in again.trajectories] == [t.token_ids for t in result.trajectories]
    for a, b in zip(again.trajectories, result.trajectories):
        assert a.behavior_logprobs == pytest.approx(b.behavior_logprobs, abs=1e-5)


class GoOnEnvironment:
    """Keeps the conversation going for `turns` turns with user observations, whatever is said:
    drives real sampled (often non-canonical, often cut-off) turns through several deltas."""

    def __init__(self, task, episode_id, turns: int = 3):
        self.task, self.turns, self.seen = task, turns, []

    async def reset(self, task):
        return task.messages()

    async def step(self, text, *, truncated=False):
        self.seen.append((text, truncated))
        if len(self.seen) >= self.turns:
            return StepResult(
                [], float(len(self.seen)), True, {"success": True, "counts": {"tool_calls": 0}}
            )
        observations = [{"role": "user", "content": f"Turn {len(self.seen)} done. Go on."}]
        if len(self.seen) == 2:
            observations.append({"role": "tool", "content": "a second observation"})
        return StepResult(observations, 0.5, False, {})

    async def close(self):
        pass


def test_real_hf_engine_multi_turn_sampled_tokens(loop, tasks, tokenizer, tiny_model):
    engine = HFEngine(tiny_model, tokenizer, dtype=torch.float32)
    envs = {}

    def factory(task, episode_id):
        envs[episode_id] = GoOnEnvironment(task, episode_id)
        return envs[episode_id]

    collector = make_collector(engine, tokenizer, None, env_factory=factory, max_new_tokens=10)
    result = loop.run_until_complete(collector.collect(tasks[:2], group_size=2, seed=5))
    assert len(result.trajectories) == 4
    for traj in result.trajectories:
        env = envs[traj.metadata["episode_id"]]
        assert traj.num_turns == 3
        assert_well_formed(tokenizer, traj)
        # The environment got exactly the decoded sampled ids, told whether each turn was cut off.
        runs = mask_runs(traj.loss_mask)
        eot = chat_tokens.end_of_turn_id(tokenizer)
        assert [text for text, _ in env.seen] == [
            tokenizer.decode(traj.token_ids[s:e], skip_special_tokens=True) for s, e in runs
        ]
        assert [cut for _, cut in env.seen] == [traj.token_ids[e - 1] != eot for s, e in runs]
        # Rewards of non-final steps sit on the last token of their turn; the total includes them.
        assert traj.turn_rewards == [(runs[0][1] - 1, 0.5), (runs[1][1] - 1, 0.5)]
        assert traj.reward == 0.5 + 0.5 + 3.0
