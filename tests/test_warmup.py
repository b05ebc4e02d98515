"""The warm start: gold scripts, the scripted engine through the real collector and servers, the
NLL loss on hand-computed numbers, and a few steps that lower it."""

from __future__ import annotations

import math
import random

import pytest
import torch
from conftest import running_manager

import environments  # noqa: F401  (registers mcp_tool)
from environments.config import EnvironmentConfig
from environments.tasks.schema import Task
from grpo.collect import chat_tokens
from grpo.collect.collector import TrajectoryCollector
from grpo.config import config_from_dict
from grpo.models.config import LoraConfig, ModelConfig
from grpo.models.policy import PolicyWithValueHead
from grpo.rollout.base import GenerationRequest, SamplingParams
from grpo.rollout.config import RolloutConfig
from grpo.rollout.scripted import ScriptedEngine
from grpo.train.gold import gold_script
from grpo.train.warmup import (
    chain_length,
    interleaved_by,
    nll_loss,
    warm_start,
    warmup_step,
)

TASK = Task.model_validate({
    "prompt": [{"role": "user", "content": "Compute 23 * 17. Store the result under the key \"alpha\"."}],
    "reward_spec": {"method": ["success", "process"], "ground_truth": {
        "task_id": "chain-1", "complexity": "medium",
        "success": {"answer": 391, "must_call_tool": True, "state": {"kv": {"alpha": 391}}},
        "tool_sequence": [
            {"step": 1, "server": "calculator", "tool": "calculate", "params": {"expression": "23 * 17"}},
            {"step": 2, "server": "kv", "tool": "put", "params": {"key": "alpha", "value": 391}, "uses": {"value": "{1}"}},
        ]}},
})


def test_balanced_batches_take_every_chain_length_in_turn():
    # 1 one-call, 2 two-call and 5 four-call tasks, as (name, length) pairs.
    tasks = [("a", 1), ("b1", 2), ("b2", 2)] + [(f"d{i}", 4) for i in range(5)]
    stream = interleaved_by(tasks, key=lambda t: t[1], rng=random.Random(0))
    drawn = [next(stream) for _ in range(12)]
    assert [length for _, length in drawn] == [1, 2, 4] * 4
    # Each group is a shuffled pass before it repeats: both two-call tasks in each pair of their
    # turns, four different four-call tasks in the four turns of their pass of five.
    assert {drawn[1][0], drawn[4][0]} == {"b1", "b2"} and {drawn[7][0], drawn[10][0]} == {"b1", "b2"}
    assert len({name for name, _ in drawn[2::3]}) == 4
    assert chain_length(TASK) == 2


def test_one_group_is_a_shuffled_pass_like_the_unbalanced_warm_start():
    tasks = list(range(7))
    stream = interleaved_by(tasks, key=lambda _: 0, rng=random.Random("seed"))
    reference = random.Random("seed")
    assert [next(stream) for _ in range(14)] == reference.sample(tasks, 7) + reference.sample(tasks, 7)


def test_the_gold_script_is_the_calls_then_the_answer():
    assert gold_script(TASK) == [
        '<tool_call>{"name": "calculate", "arguments": {"expression": "23 * 17"}}</tool_call>',
        '<tool_call>{"name": "put", "arguments": {"key": "alpha", "value": 391}}</tool_call>',
        "<answer>391</answer>",
    ]
    assert gold_script(TASK, "react")[0] == 'Action: calculate\nAction Input: {"expression": "23 * 17"}'


def test_nll_is_the_masked_token_sum_over_the_denominator():
    logprobs = torch.log(torch.tensor([[0.5, 0.25, 0.9], [0.1, 1.0, 0.2]]))
    mask = torch.tensor([[1, 1, 0], [0, 1, 1]])
    # -(ln .5 + ln .25 + ln 1 + ln .2) / 4 = (0.693147 + 1.386294 + 0 + 1.609438) / 4
    assert float(nll_loss(logprobs, mask, denominator=4.0)) == pytest.approx(3.688879 / 4, abs=1e-6)
    assert float(nll_loss(logprobs, torch.zeros_like(mask), denominator=0.0)) == 0.0


def test_the_scripted_engine_answers_by_task_and_turn(tokenizer):
    engine = ScriptedEngine(tokenizer, {"t": ["hello", "bye"]})
    sampling = SamplingParams(max_new_tokens=4)
    out = engine.generate([GenerationRequest([1], sampling, task_id="t", turn=1)])[0]
    assert out.token_ids == tokenizer.encode("bye", add_special_tokens=False) + [chat_tokens.end_of_turn_id(tokenizer)]
    assert out.behavior_logprobs == [0.0] * len(out.token_ids) and out.finish_reason == "stop"
    with pytest.raises(KeyError, match="no script for task 'u'"):
        engine.generate([GenerationRequest([1], sampling, task_id="u")])
    with pytest.raises(IndexError, match="the script has 2 turns, turn 3 was asked for"):
        engine.generate([GenerationRequest([1], sampling, task_id="t", turn=2)])


@pytest.fixture(scope="module")
def gold(loop, tokenizer):
    engine = ScriptedEngine(tokenizer, {"chain-1": gold_script(TASK)})
    with running_manager(loop, "calculator", "kv") as tools:
        collector = TrajectoryCollector(engine, tokenizer, tools, EnvironmentConfig(one_shot_example=False),
                                        RolloutConfig(max_total_tokens=1024))
        yield loop.run_until_complete(collector.collect([TASK], 1, temperature=0.0, step=-1))


def test_gold_trajectories_are_token_exact_and_succeed(gold, tokenizer):
    (trajectory,) = gold.trajectories
    assert trajectory.success and trajectory.reward == 1.0 and trajectory.num_tool_calls == 2
    sampled = [i for i, m in zip(trajectory.token_ids, trajectory.loss_mask) if m]
    expected = []
    for text in gold_script(TASK):
        expected += tokenizer.encode(text, add_special_tokens=False) + [chat_tokens.end_of_turn_id(tokenizer)]
    assert sampled == expected  # the loss mask covers exactly the scripted turns


def test_warmup_steps_lower_the_gold_nll(gold, tokenizer):
    policy, _ = PolicyWithValueHead.from_config(ModelConfig(name_or_path="tiny-random", dtype="float32"),
                                                LoraConfig(), "cpu", seed=0)
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-2)
    losses = [warmup_step(policy, optimizer, gold.trajectories, micro_batch_size=2,
                          pad_token_id=tokenizer.pad_token_id, max_grad_norm=1.0)["warmup/loss"] for _ in range(4)]
    assert all(math.isfinite(x) for x in losses) and losses[-1] < 0.8 * losses[0]


def test_micro_batch_tokens_split_a_warmup_step_without_changing_its_loss(gold, tokenizer):
    rows = gold.trajectories * 3  # gold trajectories with tool results are long: one row per forward
    length = len(rows[0].token_ids)

    def step(**cap) -> tuple[float, list[int]]:
        policy, _ = PolicyWithValueHead.from_config(ModelConfig(name_or_path="tiny-random", dtype="float32"),
                                                    LoraConfig(), "cpu", seed=0)
        shapes, forward = [], policy.forward
        policy.forward = lambda input_ids, *a, **k: shapes.append(input_ids.shape[0]) or forward(input_ids, *a, **k)
        optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-3)
        metrics = warmup_step(policy, optimizer, rows, micro_batch_size=8, pad_token_id=tokenizer.pad_token_id,
                              max_grad_norm=1.0, overhead_tokens=0, **cap)
        return metrics["warmup/loss"], shapes

    whole, whole_shapes = step()
    split, split_shapes = step(micro_batch_tokens=length)
    assert (whole_shapes, split_shapes) == ([3], [1, 1, 1])
    assert split == pytest.approx(whole, rel=1e-5)  # the same token mean, summed in another order


def test_warm_start_reports_each_step_as_it_ends_on_balanced_batches(loop, tokenizer):
    one_call = Task.model_validate({
        "prompt": [{"role": "user", "content": "Compute 6 * 7."}],
        "reward_spec": {"method": ["success"], "ground_truth": {
            "task_id": "single-1", "complexity": "easy", "success": {"answer": 42, "must_call_tool": True},
            "tool_sequence": [{"step": 1, "server": "calculator", "tool": "calculate",
                               "params": {"expression": "6 * 7"}}]}},
    })
    config = config_from_dict({
        "model": {"name_or_path": "tiny-random", "dtype": "float32"},
        "environment": {"one_shot_example": False}, "rollout": {"max_total_tokens": 1024},
        "train": {"warmup": {"steps": 3, "tasks_per_step": 2, "learning_rate": 1e-3}},
    })
    policy, _ = PolicyWithValueHead.from_config(config.model, LoraConfig(), "cpu", seed=0)
    seen = []
    with running_manager(loop, "calculator", "kv") as tools:
        history = loop.run_until_complete(warm_start(
            policy, tokenizer, tools, config, [TASK, TASK.model_copy(deep=True), one_call],
            pad_token_id=tokenizer.pad_token_id, on_step=lambda m: seen.append(dict(m))))
    assert seen == history and [m["warmup/step"] for m in seen] == [1.0, 2.0, 3.0]
    # Every batch holds one task of each chain length (1 and 2 calls), all gold episodes succeed:
    # 1-call gold turns + 2-call gold turns give the same number of trained tokens every step.
    assert [m["warmup/gold_success"] for m in seen] == [1.0, 1.0, 1.0]
    assert len({m["warmup/tokens"] for m in seen}) == 1


def test_the_warm_start_stops_when_its_minutes_run_out_after_one_step(loop, tokenizer):
    config = config_from_dict({
        "model": {"name_or_path": "tiny-random", "dtype": "float32"},
        "environment": {"one_shot_example": False}, "rollout": {"max_total_tokens": 1024},
        "train": {"warmup": {"steps": 3, "tasks_per_step": 1, "learning_rate": 1e-3, "max_minutes": 0}},
    })
    policy, _ = PolicyWithValueHead.from_config(config.model, LoraConfig(), "cpu", seed=0)
    with running_manager(loop, "calculator", "kv") as tools:
        history = loop.run_until_complete(warm_start(policy, tokenizer, tools, config, [TASK],
                                                     pad_token_id=tokenizer.pad_token_id))
    assert [m["warmup/step"] for m in history] == [1.0]
