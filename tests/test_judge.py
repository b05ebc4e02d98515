"""Judge rewards (`reward_spec.method: judge`) with a scripted judge model: strict reading of the
judge's replies, the transcript-hash cache, timeouts and malformed replies as reward errors that
exclude the group (counted, never a silent 0), group-relative judging through the collector, and
clear errors for a bad judge or tool-prompt config."""

from __future__ import annotations

import asyncio
import json

import pytest
from conftest import running_manager

import environments  # noqa: F401  (registers mcp_tool)
from environments.config import EnvironmentConfig
from environments.endpoint import EndpointError
from environments.judge.config import JudgeConfig
from environments.judge.judge import (
    GROUP_SYSTEM,
    SINGLE_SYSTEM,
    Judge,
    get_judge,
    read_group,
    read_single,
)
from environments.judge.models import ScriptedJudgeModel
from environments.mcp_tool.env import MCPToolEnvironment
from environments.rewards import Episode, RewardError, score, with_judge_score
from environments.tasks.schema import Task
from grpo.collect.collector import TrajectoryCollector  # (registers judge.backend local)
from grpo.config import ConfigError, load_config
from grpo.rollout.config import RolloutConfig
from grpo.rollout.scripted import ScriptedEngine

RUBRIC = "Full marks for the right product, written in <answer> tags."


def judged_task(task_id="calc-1", methods=("judge",), rubric=RUBRIC, question="What is 964 * 494?") -> Task:
    record = {"data_source": "test", "prompt": [{"role": "user", "content": question}],
              "reward_spec": {"method": list(methods), "rubric": rubric,
                              "ground_truth": {"task_id": task_id, "complexity": "easy",
                                               "success": {"answer": 476216}}}}
    return Task.from_record(record, "test")


def run(coro):
    return asyncio.new_event_loop().run_until_complete(coro)


# -- reading replies -------------------------------------------------------------------------------

def test_single_reply_is_read_strictly():
    assert read_single('```json\n{"score": 0.75, "reason": "close"}\n```').score == 0.75
    assert read_single('Verdict: {"score": 1, "reason": "right"}').reason == "right"
    for reply, message in [("I'd say 0.8", "holds no JSON object"),
                           ('{"score": 1.5}', "score is 1.5, not a number from 0 to 1"),
                           ('{"score": true}', "score is True, not a number from 0 to 1"),
                           ('{"reason": "fine"}', 'has no "score"'),
                           ('{"score": 0.5', "is not valid JSON")]:
        with pytest.raises(RewardError, match=message):
            read_single(reply)


def test_group_reply_needs_every_id_once():
    verdicts = read_group('{"scores": [{"id": 2, "score": 0.1}, {"id": "1", "score": 0.9, "reason": "best"}]}', 2)
    assert [(v.score, v.reason) for v in verdicts] == [(0.9, "best"), (0.1, "")]
    for reply, message in [('{"scores": [{"id": 1, "score": 0.9}]}', r"scores no episode \[2\]"),
                           ('{"scores": [{"id": 1, "score": 0.9}, {"id": 1, "score": 0.2}]}', "repeated or unknown id 1"),
                           ('{"scores": [{"id": 3, "score": 0.9}, {"id": 1, "score": 0.2}]}', "unknown id 3"),
                           ('{"ranking": [1, 2]}', 'no "scores" list')]:
        with pytest.raises(RewardError, match=message):
            read_group(reply, 2)


# -- the judge -------------------------------------------------------------------------------------

def test_episode_is_judged_once_per_transcript_and_the_prompt_holds_rubric_and_transcript():
    model = ScriptedJudgeModel(['{"score": 0.8, "reason": "ok"}', '{"score": 0.2, "reason": "wrong"}'])
    judge = Judge(model, JudgeConfig(rubric=RUBRIC))

    async def three():
        first = await judge.score_episode(RUBRIC, "USER: q\nASSISTANT: a")
        again = await judge.score_episode(RUBRIC, "USER: q\nASSISTANT: a")
        other = await judge.score_episode(RUBRIC, "USER: q\nASSISTANT: b")
        return first, again, other

    first, again, other = run(three())
    assert (first.score, again.score, other.score) == (0.8, 0.8, 0.2)
    assert (judge.requests, judge.cache_hits, len(model.seen)) == (2, 1, 2)
    assert model.seen[0] == [{"role": "system", "content": SINGLE_SYSTEM},
                             {"role": "user", "content": f"Rubric:\n{RUBRIC}\n\nEpisode:\nUSER: q\nASSISTANT: a"}]


def test_timeout_and_backend_failure_are_reward_errors_and_not_cached():
    slow = Judge(ScriptedJudgeModel(['{"score": 1}'], delay_s=2.0), JudgeConfig(timeout=0.05))
    with pytest.raises(RewardError, match=r"did not answer within judge.timeout=0.05 s"):
        run(slow.score_episode(RUBRIC, "t"))
    broken = Judge(ScriptedJudgeModel([ConnectionError("refused"), '{"score": 0.4}']), JudgeConfig())
    with pytest.raises(RewardError, match=r"the judge request failed: ConnectionError\('refused'\)"):
        run(broken.score_episode(RUBRIC, "t"))
    assert run(broken.score_episode(RUBRIC, "t")).score == 0.4 and broken.cache_hits == 0


def test_local_judge_runs_a_model_through_our_engine_and_rejects_its_free_text():
    """`backend: local` (registered by grpo) answers with the tiny random model through HFEngine;
    its reply is no JSON, so judging it is a reward error quoting the reply."""
    config = JudgeConfig(backend="local", name_or_path="tiny-random", device="cpu", max_new_tokens=6)
    judge = get_judge(config)
    assert type(judge.model).__name__ == "LocalJudgeModel" and get_judge(config) is judge
    reply = run(judge.model.complete([{"role": "user", "content": "Score this."}]))
    assert isinstance(reply, str)
    with pytest.raises(RewardError, match="the judge's reply (holds no JSON object|is not valid JSON)"):
        run(judge.score_episode(RUBRIC, "USER: q\nASSISTANT: a"))


def test_openai_judge_without_its_key_names_the_variable(monkeypatch):
    monkeypatch.delenv("JUDGE_KEY_FOR_TEST", raising=False)
    config = JudgeConfig(backend="openai", base_url="http://127.0.0.1:9/v1", model="m", api_key_env="JUDGE_KEY_FOR_TEST")
    with pytest.raises(EndpointError, match="needs an API key in the environment variable JUDGE_KEY_FOR_TEST"):
        get_judge(config)


def test_bad_judge_and_tool_prompt_config_are_clear_errors():
    with pytest.raises(ConfigError, match=r"environment.tool_prompt: got 'xml'; allowed values: 'auto', 'native' or "
                                          r"'compact'"):
        load_config("configs/cpu.yaml", ["environment.tool_prompt=xml"])
    with pytest.raises(ConfigError, match="judge.backend 'openai' needs judge.base_url and judge.model"):
        load_config("configs/cpu.yaml", ["environment.judge.backend=openai"])
    with pytest.raises(ConfigError, match="environment.chat_template: no such file: 'missing.jinja'"):
        load_config("configs/cpu.yaml", ["environment.chat_template=missing.jinja"])


# -- scores in the reward ------------------------------------------------------------------------

def test_judge_component_in_the_weighted_reward():
    task = Task.from_record({
        "prompt": [{"role": "user", "content": "q"}],
        "reward_spec": {"method": ["final_answer", "judge"], "weights": {"final_answer": 3.0}, "rubric": RUBRIC,
                        "ground_truth": {"task_id": "t", "complexity": "easy", "success": {"answer": 4}}}}, "test")
    right = Episode(final_answer="4")
    # (3 * 1 + 1 * 0.6) / 4 = 0.9; the judge's check passes at 0.6 >= 0.5.
    now = score(task, right, EnvironmentConfig(), judge_score=0.6)
    assert now.total == pytest.approx(0.9, abs=1e-12) and now.success and now.checks == {"judge": True,
                                                                                          "final_answer": True}
    # Pending (group-relative): 0 until filled in, then the same as judged at once.
    pending = score(task, right, EnvironmentConfig())
    assert pending.total == pytest.approx(0.75, abs=1e-12) and not pending.success
    filled = with_judge_score(task, pending, 0.6, EnvironmentConfig())
    assert (filled.total, filled.success, filled.components) == (now.total, True, {"final_answer": 1.0, "judge": 0.6})
    low = with_judge_score(task, pending, 0.4, EnvironmentConfig())
    assert low.total == pytest.approx(0.85, abs=1e-12) and not low.success


# -- through the collector -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def calculator(loop):
    with running_manager(loop, "calculator") as manager:
        yield manager


def collect(loop, tokenizer, calculator, tasks, judge, *, group_size=1, group=False, retries=1):
    config = EnvironmentConfig(one_shot_example=False, judge=JudgeConfig(group=group))
    scripts = {task.task_id: ["<answer>476216</answer>"] for task in tasks}
    collector = TrajectoryCollector(
        ScriptedEngine(tokenizer, scripts), tokenizer, calculator, config,
        RolloutConfig(max_new_tokens=32, max_total_tokens=1024, episode_retries=retries),
        env_factory=lambda task, episode_id: MCPToolEnvironment(calculator, collector.env_config, episode_id, judge))
    collector.judge = judge
    return loop.run_until_complete(collector.collect(tasks, group_size))


def test_judged_episode_gets_the_judges_score(loop, tokenizer, calculator):
    model = ScriptedJudgeModel(['{"score": 0.7, "reason": "right, tags used"}'])
    result = collect(loop, tokenizer, calculator, [judged_task()], Judge(model, JudgeConfig()))
    (traj,) = result.trajectories
    assert traj.reward == 0.7 and traj.metadata["success"] is True
    assert traj.metadata["info"]["judge"] == {"score": 0.7, "reason": "right, tags used"}
    assert model.seen[0][1]["content"] == (f"Rubric:\n{RUBRIC}\n\nEpisode:\nUSER: What is 964 * 494?\n"
                                           "ASSISTANT: <answer>476216</answer>")
    assert result.metrics["rollout/reward_error_groups"] == 0.0


def test_malformed_judge_reply_excludes_the_group_and_is_counted(loop, tokenizer, calculator):
    model = ScriptedJudgeModel(["The answer looks right to me.", "Score: high"])  # both attempts
    result = collect(loop, tokenizer, calculator, [judged_task("bad"), judged_task("missing", rubric=None)],
                     Judge(model, JudgeConfig()), retries=1)
    assert result.trajectories == [] and result.excluded_groups == 2 and result.reward_error_groups == 1
    assert result.metrics["rollout/reward_error_groups"] == 1.0
    assert "RewardError(\"the judge's reply holds no JSON object: 'Score: high'\")" in result.errors[0]
    assert "task missing is scored by method 'judge' but has no reward_spec.rubric" in result.errors[1]


def test_group_relative_judging_scores_each_group_in_one_request(loop, tokenizer, calculator):
    def ranking(messages):
        episodes = messages[1]["content"].count("\nEpisode ")
        return json.dumps({"scores": [{"id": i, "score": i / 10, "reason": f"#{i}"} for i in range(1, episodes + 1)]})

    model = ScriptedJudgeModel([ranking, "no idea"])
    tasks = [judged_task("a", methods=("final_answer", "judge")),
             judged_task("b", methods=("final_answer", "judge"), question="What is 964 * 495?")]
    result = collect(loop, tokenizer, calculator, tasks, Judge(model, JudgeConfig(group=True)), group_size=3, group=True)
    assert len(model.seen) == 2 and model.seen[0][0]["content"] == GROUP_SYSTEM.format(n=3)
    assert model.seen[0][1]["content"].count("Episode ") == 3
    kept = result.trajectories
    assert [t.task_id for t in kept] == ["a"] * 3 and result.reward_error_groups == 1 and result.excluded_groups == 1
    # final_answer 1 and judge 0.1 / 0.2 / 0.3, equal weights: (1 + s) / 2; success needs judge >= 0.5.
    assert [t.reward for t in kept] == [pytest.approx((1 + s) / 2, abs=1e-12) for s in (0.1, 0.2, 0.3)]
    assert [t.metadata["info"]["judge"]["reason"] for t in kept] == ["#1", "#2", "#3"]
    assert not any(t.success for t in kept) and "judge_pending" not in kept[0].metadata["info"]
    assert "task b: RewardError(\"the judge's reply holds no JSON object: 'no idea'\")" in result.errors
