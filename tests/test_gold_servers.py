"""Warm-start gold trajectories of tasks generated from the real third-party servers (time, git,
SQLite, the npm filesystem server, as `make servers` installs them): every gold episode succeeds;
arguments picked from earlier results come from the episode's own results even where the
recorded ones are stale (a clock read, a commit hash); episodes in flight together each have
their own copy of a stateful server's state; the warm start trains on them."""

from __future__ import annotations

import copy
import re

import pytest
from test_taskgen_servers import _config, _missing

import environments  # noqa: F401  (registers mcp_tool)
from environments.config import EnvironmentConfig
from environments.taskgen.run import generate_tasks
from environments.tasks.schema import Task
from grpo.collect.collector import TrajectoryCollector
from grpo.config import config_from_dict
from grpo.models.config import LoraConfig
from grpo.models.policy import PolicyWithValueHead
from grpo.rollout.config import RolloutConfig
from grpo.rollout.scripted import ScriptedEngine
from grpo.train.gold import GoldPlayer
from grpo.train.warmup import warm_start
from launch.build_fixtures import build
from tools.manager import SharedToolManager

FOUR = ("time", "git", "sqlite", "filesystem")


@pytest.fixture(scope="module")
def tools(loop, tmp_path_factory):
    servers = [s for s in FOUR if _missing(s) is None]
    if not servers:
        pytest.skip(_missing("time"))
    fixtures = tmp_path_factory.mktemp("fixtures")
    build(fixtures, ["files", "git", "sql", "memory"])
    manager = SharedToolManager(_config(fixtures, servers))
    loop.run_until_complete(manager.start())
    yield manager
    loop.run_until_complete(manager.close())


@pytest.fixture(scope="module")
def tasks(loop, tools) -> list[Task]:
    servers = sorted({s.server for s in tools.tool_specs()})
    outcome = loop.run_until_complete(generate_tasks(tools, servers=servers, num=10 * len(servers), max_steps=3,
                                                     seed=5, eval_tasks=0, novel_tasks=0, examples=0))
    return [Task.from_record(r, r["reward_spec"]["ground_truth"]["task_id"]) for r in outcome.records]


def _play(loop, tools, tokenizer, tasks: list[Task]) -> tuple[list, GoldPlayer]:
    player = GoldPlayer()
    collector = TrajectoryCollector(ScriptedEngine(tokenizer, player), tokenizer, tools,
                                    EnvironmentConfig(one_shot_example=False), RolloutConfig(max_total_tokens=4096))
    collector.env_factory = player.env_factory(tools, collector)
    result = loop.run_until_complete(collector.collect(tasks, 1, temperature=0.0, step=-1))
    assert result.excluded_groups == 0, result.errors
    return result.trajectories, player


def _calls_of(player: GoldPlayer, task_id: str) -> list:
    (env,) = [e for e in player.envs.values() if e.task.task_id == task_id]
    return env.episode.calls


def test_every_gold_episode_succeeds_on_every_server(loop, tools, tasks, tokenizer):
    trajectories, player = _play(loop, tools, tokenizer, tasks)
    assert player.failures == {}
    failed = [(t.task_id, t.reward) for t in trajectories if not t.success]
    assert failed == [] and len(trajectories) == len(tasks)
    servers = {step.server for task in tasks for step in task.ground_truth.tool_sequence}
    picked = {step.server for task in tasks for step in task.ground_truth.tool_sequence if step.picks}
    assert servers == {s.server for s in tools.tool_specs()} and picked == servers  # each server chains


def _picking(tasks: list[Task], source: str, tool: str, name: str) -> Task:
    """The first two-call task whose second call, `tool`, takes `name` from the first, `source`."""
    return next(t for t in tasks if [s.tool for s in t.ground_truth.tool_sequence] == [source, tool]
                and name in t.ground_truth.tool_sequence[1].picks)


def _stale(task: Task, tool: str, name: str, value: str) -> Task:
    """The task with the recorded value of a picked argument replaced by a wrong one."""
    stale = copy.deepcopy(task)
    (step,) = [s for s in stale.ground_truth.tool_sequence if s.tool == tool and name in s.picks]
    step.params[name] = value
    return stale


def test_picked_arguments_come_from_the_episodes_own_results_not_the_recorded_ones(loop, tools, tasks, tokenizer):
    servers = {s.server for s in tools.tool_specs()}
    chosen = []
    if "time" in servers:
        clock = _picking(tasks, "get_current_time", "convert_time", "time")
        chosen.append((_stale(clock, "convert_time", "time", "99:99"), "convert_time", "time"))
    if "git" in servers:
        log_show = _picking(tasks, "git_log", "git_show", "revision")
        chosen.append((_stale(log_show, "git_show", "revision", "0" * 40), "git_show", "revision"))
    if not chosen:
        pytest.skip(_missing("git"))
    trajectories, player = _play(loop, tools, tokenizer, [task for task, _, _ in chosen])
    assert all(t.success for t in trajectories)
    for task, tool, name in chosen:
        calls = _calls_of(player, task.task_id)
        used = next(c for c in calls if c.tool == tool).arguments[name]
        assert used != task.ground_truth.tool_sequence[1].params[name]
        if tool == "convert_time":  # the hours and minutes the episode's own clock read
            now = next(c for c in calls if c.tool == "get_current_time").result
            assert re.fullmatch(r"\d\d:\d\d", used) and f"T{used}:" in now
        else:  # the hash the episode's own log shows for the commit the request names
            log = next(c for c in calls if c.tool == "git_log").result
            commit = used[:40]  # a revision may name a file in it or its parent (`<hash>~1:notes.txt`)
            assert re.fullmatch(r"[0-9a-f]{40}", commit) and f"Commit: {commit}" in log


def test_gold_episodes_in_flight_together_each_write_their_own_copy(loop, tools, tasks, tokenizer):
    writes = [t for t in tasks if t.extra_info["template"] in ("sqlite/sql:insert_count", "filesystem/files:write",
                                                               "filesystem/files:mkdir_write", "git/git:stage_commit")]
    if not writes:
        pytest.skip(_missing("sqlite"))
    twins = []
    for task in writes:  # the same write twice, at once: on a shared state the second would see the first
        for copy_id in ("a", "b"):
            twin = copy.deepcopy(task)
            twin.reward_spec.ground_truth.task_id = f"{task.task_id}-{copy_id}"
            twins.append(twin)
    trajectories, player = _play(loop, tools, tokenizer, twins)
    assert player.failures == {} and [t.task_id for t in trajectories if not t.success] == []


def test_the_warm_start_trains_on_every_servers_gold(loop, tools, tasks, tokenizer):
    config = config_from_dict({
        "model": {"name_or_path": "tiny-random", "dtype": "float32"},
        "environment": {"one_shot_example": False, "tools": {"exposure": "task", "distractors": 2}},
        "rollout": {"max_total_tokens": 4096},
        "train": {"warmup": {"steps": 2, "tasks_per_step": 6, "learning_rate": 1e-3}},
    })
    policy, _ = PolicyWithValueHead.from_config(config.model, LoraConfig(), "cpu", seed=0)
    history = loop.run_until_complete(warm_start(policy, tokenizer, tools, config, tasks,
                                                 pad_token_id=tokenizer.pad_token_id))
    assert [m["warmup/gold_success"] for m in history] == [1.0, 1.0]
    assert history[1]["warmup/loss"] < history[0]["warmup/loss"]
