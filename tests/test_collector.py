"""TrajectoryCollector: token-exact trajectories and their metrics, turn seeds, the real HFEngine.

Real parts: the SmolLM2 tokenizer, the bundled calculator MCP server behind the real
SharedToolManager, MCPToolEnvironment, and (in two tests) the tiny model with the real HFEngine.
The one fake is `ScriptedEngine` (tests/collector_helpers.py), a stand-in for the policy that
writes fixed texts per turn. Batching, bounds and failures: tests/test_collector_scheduling.py.
"""

from __future__ import annotations

import pytest
import torch
from collector_helpers import (
    GoOnEnvironment,
    ScriptedEngine,
    assert_well_formed,
    make_collector,
    rebuild_from_transcript,
    scripted_logprob,
    task_expression,
    tool_calls_then_answer,
)
from conftest import mask_runs

import environments  # noqa: F401  (registers mcp_tool)
from environments.tasks.loading import generate_tasks
from grpo.collect import chat_tokens
from grpo.collect.collector import turn_seed
from grpo.rollout.config import HFEngineConfig
from grpo.rollout.hf.engine import HFEngine


@pytest.fixture(scope="module")
def tasks():
    return generate_tasks("calculator", 3, seed=0)


def _encode(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


# -- token in, token out -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "calls,end_tool_turns",
    [(0, True), (1, True), (4, True), (1, False)],
    ids=["1-turn", "2-turn", "5-turn", "2-turn-first-cut-off"],
)
def test_trajectory_is_prompt_plus_sampled_plus_observation_deltas(
    loop, calculator_tools, tasks, tokenizer, calls, end_tool_turns
):
    engine = ScriptedEngine(
        tokenizer, tasks, tool_calls_then_answer(calls, end_tool_turns=end_tool_turns)
    )
    collector = make_collector(engine, tokenizer, calculator_tools)
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
            assert traj.token_ids[start:end] == engine.turn_ids(task_expression(task), turn)
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


class ServerReportingEngine(ScriptedEngine):
    """Reports as the vLLM server engine does: one server failure and two failed-over requests
    per call, and one server fewer serving after each."""

    def generate(self, requests):
        results = super().generate(requests)
        self.last_metrics = {"server_failures": 1.0, "retried_requests": 2.0,
                             "live_servers": float(8 - len(self.batch_sizes)), "seconds": 0.5}
        return results


def test_server_failures_of_a_collection_reach_its_metrics(loop, calculator_tools, tasks, tokenizer):
    # Failures are counted over the collection's engine calls; the servers left live are the last call's.
    engine = ServerReportingEngine(tokenizer, tasks, tool_calls_then_answer(1))
    m = loop.run_until_complete(make_collector(engine, tokenizer, calculator_tools).collect(tasks[:2], 2, seed=0)).metrics
    calls = len(engine.batch_sizes)
    assert (m["rollout/engine_server_failures"], m["rollout/engine_retried_requests"]) == (calls, 2 * calls)
    assert m["rollout/engine_live_servers"] == 8 - calls and "rollout/engine_seconds" not in m


def test_metrics_and_metadata(loop, calculator_tools, tasks, tokenizer):
    engine = ScriptedEngine(tokenizer, tasks, tool_calls_then_answer(1))
    result = loop.run_until_complete(
        make_collector(engine, tokenizer, calculator_tools).collect(tasks[:2], 2, seed=0)
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


def test_real_hf_engine_end_to_end(loop, calculator_tools, tasks, tokenizer, tiny_model):
    engine = HFEngine(tiny_model, tokenizer, HFEngineConfig(max_batch_size=16), dtype=torch.float32)
    collector = make_collector(engine, tokenizer, calculator_tools, max_new_tokens=12)

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


def test_a_groups_episodes_render_their_prompt_once(loop, calculator_tools, tasks, tokenizer, monkeypatch):
    rendered = []
    prompt_ids = chat_tokens.prompt_ids

    def counted(tokenizer, messages, tools=None):
        rendered.append(messages[-1]["content"])
        return prompt_ids(tokenizer, messages, tools)

    monkeypatch.setattr(chat_tokens, "prompt_ids", counted)
    collector = make_collector(ScriptedEngine(tokenizer, tasks, tool_calls_then_answer(1)), tokenizer, calculator_tools)
    for _ in range(2):
        result = loop.run_until_complete(collector.collect(tasks[:2], group_size=4, seed=0))
        assert len(result.trajectories) == 8 and result.failed_episodes == 0
        for traj in result.trajectories:  # each episode's prompt is its own task's, rendered exactly
            prompt = traj.metadata["transcript"][: traj.metadata["prompt_messages"]]
            assert traj.token_ids[: traj.prompt_length] == prompt_ids(tokenizer, prompt)
    # Once per task and collection: the cache starts empty at each collection.
    assert len(rendered) == 4 and rendered[0] != rendered[1] and rendered[:2] == rendered[2:]
