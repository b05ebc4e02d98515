"""BFCL multi-turn: data and splits, the `bfcl` MCP server, and the `bfcl` environment.

The gold trajectories of all 800 tasks (four categories x 200, `possible_answer`) are replayed
through the real `bfcl` server (a subprocess behind SharedToolManager) and the environment, and
must all pass the official checker; corrupted trajectories must fail it. Needs bfcl-eval
(`make install` installs it); without it every test here is skipped with the install command.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("bfcl_eval", reason="bfcl-eval is not installed: pip install --no-deps bfcl-eval mpmath")

from conftest import running_manager

import environments  # noqa: F401  (registers bfcl)
from environments.base import Environment, resolve
from environments.bfcl.data import (
    CATEGORIES,
    BFCLUnavailable,
    declared_split,
    gold_script,
    load_bfcl_tasks,
    load_entries,
    parse_call,
    require_bfcl,
    scenario_index,
    split_rule,
)
from environments.bfcl.env import BFCLEnvironment
from environments.bfcl.scoring import bfcl_reward, official_check
from environments.config import BFCLEnvConfig, DatasetSource, EnvironmentConfig
from environments.tasks.loading import load_tasks
from environments.tasks.schema import TaskDataError
from environments.toolcalls import format_tool_call
from tools.servers import bfcl as bfcl_server

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tools(loop):
    with running_manager(loop, "bfcl", call_timeout=30.0) as manager:
        yield manager


def task_by_id(task_id: str):
    category = task_id[len("multi_turn_"):].rsplit("_", 1)[0]
    return next(t for t in load_bfcl_tasks(category, "all") if t.task_id == task_id)


async def play(tools, task, texts, config=None, episode_id="ep"):
    """Reset, then step through `texts` until done; (env, prompt, step results)."""
    env = BFCLEnvironment(tools, config or EnvironmentConfig(), episode_id)
    prompt = await env.reset(task)
    results = []
    try:
        for text in texts:
            results.append(await env.step(text))
            if results[-1].done:
                break
    finally:
        await env.close()
    return env, prompt, results


def call(name: str, **arguments) -> str:
    return format_tool_call(name, arguments, "hermes")


# -- data and splits -----------------------------------------------------------------------------

def test_every_category_has_200_entries_with_their_ground_truth():
    for category in CATEGORIES:
        entries = load_entries(category)
        assert len(entries) == 200
        assert all(len(e["question"]) == len(e["ground_truth"]) for e in entries)


def test_declared_split_is_the_rule_disjoint_and_complete():
    split = declared_split()
    assert not split["train"] & split["eval"]
    assert split["train"] | split["eval"] == set(range(200))
    assert all(split_rule(i) == name for name, indices in split.items() for i in indices)
    saved = json.loads((REPO / "configs" / "data" / "bfcl_split.json").read_text())
    assert sorted(saved["eval"]) == sorted(split["eval"])


def test_training_tasks_never_include_an_evaluation_scenario_in_any_category():
    train = load_bfcl_tasks("all", "train")
    held_out = load_bfcl_tasks("all", "eval")
    assert (len(train), len(held_out)) == (600, 200)
    assert not {scenario_index(t.task_id) for t in train} & {scenario_index(t.task_id) for t in held_out}
    assert {t.env_class for t in train} == {"bfcl"}


def test_dataset_path_spec_loads_tasks_and_bad_specs_are_clear_errors():
    tasks = load_tasks(DatasetSource(path="bfcl:base,miss_func:eval"))
    assert len(tasks) == 100 and tasks[0].task_id == "multi_turn_base_0"
    assert load_bfcl_tasks("base", "eval", limit=3)[-1].task_id == "multi_turn_base_8"
    with pytest.raises(TaskDataError, match="unknown BFCL category 'nope'.*base, miss_func"):
        load_tasks(DatasetSource(path="bfcl:nope:eval"))
    with pytest.raises(TaskDataError, match="unknown BFCL split"):
        load_tasks(DatasetSource(path="bfcl:base:test"))
    with pytest.raises(TaskDataError, match="expected bfcl:<categories"):
        load_tasks(DatasetSource(path="bfcl:base"))


def test_missing_package_is_an_error_naming_the_pip_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "bfcl_eval", None)  # makes `import bfcl_eval` fail
    with pytest.raises(BFCLUnavailable, match=r"pip install --no-deps bfcl-eval mpmath"):
        require_bfcl()


def test_evaluate_cli_rejects_an_unknown_category(capsys):
    from launch.evaluate import main

    assert main(["--config", "configs/bfcl.yaml", "--env", "bfcl", "--category", "nope"]) == 2
    assert "unknown BFCL category 'nope'" in capsys.readouterr().err


def test_bfcl_tasks_in_another_environment_are_a_clear_error():
    with pytest.raises(ValueError, match="env_class 'bfcl'"):
        bfcl_reward(load_bfcl_tasks("base", "eval", limit=1)[0], None)


def test_positional_ground_truth_arguments_are_named_from_the_backend():
    assert parse_call("sort('final_report.pdf')") == ("sort", {"file_name": "final_report.pdf"})
    assert parse_call("ls(a=True)") == ("ls", {"a": True})


# -- the server, in process ----------------------------------------------------------------------

def test_server_exposes_documented_schemas_and_isolates_concurrent_episodes(loop):
    from mcp import Client

    server = bfcl_server.register_functions()
    entry = load_entries("base")[0]  # GorillaFileSystem + TwitterAPI

    async def run():
        async with Client(server) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            tail = tools["tail"].input_schema
            assert tail["properties"]["lines"]["type"] == "integer" and tail["required"] == ["file_name"]
            assert "episode_id" in tail["properties"]  # reserved: the manager hides and fills it
            assert len(tools) == 128 + len(bfcl_server.CONTROL_TOOLS)

            async def episode(i: int) -> str:
                ep = {"episode_id": f"iso-{i}"}
                start = {"involved_classes": entry["involved_classes"], "initial_config": entry["initial_config"],
                         "withheld": ["sort"], **ep}
                listed = json.loads((await client.call_tool("bfcl_start", start)).content[0].text)["tools"]
                assert "sort" not in listed and "mkdir" in listed
                await client.call_tool("cd", {"folder": "document", **ep})
                await client.call_tool("mkdir", {"dir_name": f"only-{i}", **ep})
                text = (await client.call_tool("ls", ep)).content[0].text
                await client.call_tool("bfcl_end", ep)
                return text

            listings = await asyncio.gather(*(episode(i) for i in range(20)))
            for i, text in enumerate(listings):
                names = json.loads(text)["current_directory_content"]
                assert sorted(names) == sorted(["final_report.pdf", "previous_report.pdf", f"only-{i}"])
            gone = await client.call_tool("ls", {"episode_id": "iso-0"})
            assert gone.is_error and "no BFCL episode" in gone.content[0].text
            other = await client.call_tool("add", {"a": 1, "b": 2, "episode_id": "iso-1"})
            assert other.is_error

    loop.run_until_complete(run())


# -- the environment over the real server subprocess ----------------------------------------------

@pytest.mark.parametrize("category", CATEGORIES)
def test_gold_trajectories_pass_the_official_checker_on_every_task(loop, tools, category):
    tasks = load_bfcl_tasks(category, "all")

    async def run():
        limit = asyncio.Semaphore(16)  # concurrent episodes of one server process

        async def one(i, task):
            async with limit:
                _, _, results = await play(tools, task, gold_script(task.extra_info["bfcl"]), episode_id=f"g{i}")
                return results[-1]

        return await asyncio.gather(*(one(i, t) for i, t in enumerate(tasks)))

    results = loop.run_until_complete(run())
    failed = [(r.info["bfcl"]["id"], r.info["bfcl"]["error_type"]) for r in results if not r.info["bfcl"]["official"]]
    assert len(results) == 200 and not failed
    assert all(r.done and r.reward == 1.0 and r.info["bfcl"]["turn_credit"] == 1.0 for r in results)


def test_corrupted_trajectories_fail_and_credit_counts_leading_turns(loop, tools):
    task = task_by_id("multi_turn_base_0")  # 4 turns
    gold = gold_script(task.extra_info["bfcl"])
    wrong_argument = [gold[0].replace("'temp'", "'tmp'").replace('"temp"', '"tmp"'), *gold[1:]]
    skipped_last_turn = gold[:-2] + ["Done."]
    config = EnvironmentConfig(bfcl=BFCLEnvConfig(reward="turn_credit"))

    async def run():
        return await asyncio.gather(play(tools, task, wrong_argument, config, "c1"),
                                    play(tools, task, skipped_last_turn, config, "c2"),
                                    play(tools, task, gold, config, "c3"))

    (_, _, first), (_, _, last), (_, _, good) = loop.run_until_complete(run())
    assert first[-1].info["bfcl"]["official"] is False and first[-1].info["success"] is False
    assert first[-1].info["bfcl"]["turn_credit"] == 0.0 and sum(r.reward for r in first) == 0.0
    assert last[-1].info["bfcl"]["official"] is False
    assert last[-1].info["bfcl"]["error_type"] == "multi_turn:empty_turn_model_response"
    assert last[-1].info["bfcl"]["turns_passed"] == 3 and sum(r.reward for r in last) == pytest.approx(0.75)
    assert last[-1].info["reward_breakdown"] == {"official": 0.0, "turn_credit": 0.75}
    # Per-turn credit for turn_grpo: every assistant step of a passed user turn scores 1.
    units = last[-1].info["turn_credit"]["units"]
    assert len(units) == len(skipped_last_turn) and units[-1] == [len(units), 0.0, "user_turn=3"]
    assert [u[1] for u in units if u[2] != "user_turn=3"] == [1.0] * (len(units) - 1)
    assert {u[1] for u in first[-1].info["turn_credit"]["units"]} == {0.0}
    assert good[-1].info["bfcl"]["official"] is True and sum(r.reward for r in good) == pytest.approx(1.0)


def test_official_checker_rejects_a_changed_call_and_accepts_the_ground_truth():
    bfcl = task_by_id("multi_turn_base_1").extra_info["bfcl"]
    gold = [[list(turn)] for turn in bfcl["ground_truth"]]
    assert official_check(bfcl, gold).valid
    changed = [[["pwd()"]] if i == 3 else t for i, t in enumerate(gold)]
    assert official_check(bfcl, changed).error_type == "multi_turn:execution_response_mismatch"
    assert official_check(bfcl, gold[:2]).error_type == "multi_turn:force_terminated"


def test_turns_are_fed_one_at_a_time_and_withheld_functions_come_back(loop, tools):
    task = task_by_id("multi_turn_miss_func_0")  # `sort` is withheld until turn 3
    bfcl = task.extra_info["bfcl"]
    _, prompt, results = loop.run_until_complete(play(tools, task, gold_script(bfcl), episode_id="mf"))
    assert prompt[0]["role"] == "system" and "- sort(" not in prompt[0]["content"]
    assert "- mkdir(" in prompt[0]["content"] and prompt[1:] == bfcl["turns"][0]
    user_turns = [r.observations for r in results if r.observations and r.observations[0]["role"] == "user"]
    assert [m[0]["content"] for m in user_turns][:2] == [bfcl["turns"][1][0]["content"], bfcl["turns"][2][0]["content"]]
    assert "- sort(" in user_turns[2][0]["content"] and "What about now?" in user_turns[2][0]["content"]
    assert results[-1].info["bfcl"]["official"] is True


def test_step_limit_forces_the_episode_to_quit(loop, tools):
    task = task_by_id("multi_turn_base_1")
    config = EnvironmentConfig(bfcl=BFCLEnvConfig(step_limit=2))
    _, _, results = loop.run_until_complete(play(tools, task, [call("pwd")] * 5, config, "limit"))
    assert len(results) == 3 and results[-1].done
    info = results[-1].info["bfcl"]
    assert info["force_quit"] and not info["official"] and info["error_type"] == "multi_turn:force_terminated"


def test_bad_calls_are_observations_and_badly_typed_arguments_still_run_as_in_bfcl(loop, tools):
    task = task_by_id("multi_turn_base_1")
    texts = [call("no_such_function", x=1) + call("cd", folder="workspace") + call("tail", file_name="log.txt",
                                                                                   lines="3")]
    env, _, results = loop.run_until_complete(play(tools, task, texts + ["Done."], episode_id="bad"))
    unknown, moved, tail = results[0].observations
    assert unknown["content"].startswith("Error: unknown function 'no_such_function'")
    assert json.loads(moved["content"]) == {"current_working_directory": "workspace"}
    # lines="3" breaks the documented type: BFCL runs it anyway and shows the backend's exception.
    assert tail["content"].startswith("Error during execution: '>' not supported")
    assert env.counts["unchecked_calls"] == 1
    assert env.decoded[0] == [["cd(folder='workspace')", "tail(file_name='log.txt', lines='3')"]]


def test_registered_and_protocol(tools):
    assert resolve("bfcl") is BFCLEnvironment
    assert isinstance(BFCLEnvironment(tools, EnvironmentConfig(), "p"), Environment)


def test_server_without_bfcl_eval_exits_naming_the_pip_command():
    import subprocess

    code = "import sys; sys.modules['bfcl_eval'] = None; from tools.servers.bfcl import main; main([])"
    done = subprocess.run([sys.executable, "-c", code], check=False, cwd=REPO, capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 2
    assert "pip install --no-deps bfcl-eval mpmath" in done.stderr


def test_summary_reports_official_accuracy_and_turn_credit_per_category_apart():
    from types import SimpleNamespace

    from environments.bfcl.scoring import summarize

    tasks = load_bfcl_tasks("base", "eval", limit=2) + load_bfcl_tasks("miss_func", "eval", limit=1)

    def traj(task, official, credit):
        info = {"bfcl": {"official": official, "turn_credit": credit}}
        return SimpleNamespace(task_id=task.task_id, metadata={"info": info})

    # The miss_func task has no trajectory (its group was excluded): it counts as failed.
    metrics = summarize([traj(tasks[0], True, 1.0), traj(tasks[1], False, 0.5)], tasks)
    assert metrics["bfcl/base/accuracy"] == 0.5 and metrics["bfcl/base/turn_credit"] == 0.75
    assert metrics["bfcl/miss_func/accuracy"] == 0.0 and metrics["bfcl/miss_func/episodes"] == 1.0
    assert metrics["bfcl/overall/accuracy"] == pytest.approx(1 / 3)
