"""What tests/test_collector.py and tests/test_collector_scheduling.py share: `ScriptedEngine`
(the one fake, a stand-in for the policy that writes fixed texts per turn), the scripts it
follows, a collector over the calculator environment, and the checks of a trajectory."""

from __future__ import annotations

import json
import re
import threading
import time

from conftest import mask_runs

from environments.base import StepResult
from environments.config import EnvironmentConfig
from grpo.collect import chat_tokens
from grpo.collect.collector import TrajectoryCollector
from grpo.rollout.base import GenerationResult, RolloutEngine
from grpo.rollout.config import RolloutConfig


def task_expression(task) -> str:
    return task.extra_info["expression"]


def task_answer(task):
    return task.reward_spec.ground_truth.success.answer


def calculate_call(expression: str) -> str:
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
        self.answers = {task_expression(t): task_answer(t) for t in tasks}
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
            return calculate_call(expression), end_tool_turns
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


# -- checks of a trajectory --------------------------------------------------------------------


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
