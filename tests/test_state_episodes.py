"""Episodes on stateful servers (tools/state.py) through the environment and the collector: the
environment leases at reset and gives back at close (also when the episode failed), end-state
checks run on the episode's own copy, and a collection with more episodes in flight than the pool
has instances completes (episodes wait for a lease) or, when nothing frees up, excludes the groups
with an error that says why."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from conftest import REPO
from servers.leaks import no_leftover_server_processes  # noqa: F401 - session-level leak check

from environments.config import EnvironmentConfig
from environments.mcp_tool.env import MCPToolEnvironment
from environments.tasks.schema import Task
from grpo.collect.collector import TrajectoryCollector
from grpo.rollout.config import RolloutConfig
from grpo.rollout.scripted import ScriptedEngine
from tools.config import ToolsConfig
from tools.manager import SharedToolManager, ToolServerStartError

FILES_SERVER = str(REPO / "tests" / "servers" / "files.py")


@pytest.fixture
def fixture_dir(tmp_path) -> Path:
    root = tmp_path / "fixture"
    root.mkdir()
    (root / "seed.txt").write_text("seed")
    return root


def files_tools(fixture: Path, **state) -> ToolsConfig:
    return ToolsConfig(servers={"files": {"command": "python", "args": [FILES_SERVER], "startup_timeout": 60,
                                          "state": {"fixture": str(fixture), "reset": "copy", **state}}})


def write_task(task_id: str, name: str, text: str, setup: list | None = None) -> dict:
    """Write `text` to `name`; scored only by end-state checks on the episode's own copy."""
    return {"prompt": [{"role": "user", "content": f"Write {text} into {name}."}],
            "setup": setup or [],
            "reward_spec": {"method": ["state"], "ground_truth": {
                "task_id": task_id, "complexity": "easy",
                "tool_sequence": [{"server": "files", "tool": "write_file", "params": {"path": name, "content": text}}],
                "success": {"checks": [
                    {"server": "files", "tool": "read_file", "params": {"path": name}, "expect": text},
                    {"server": "files", "tool": "list_files", "expect": sorted([name, "seed.txt"])}]}}}}


def call(name: str, arguments: dict) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def test_more_episodes_than_instances_wait_for_leases_and_each_scores_on_its_own_copy(tokenizer, fixture_dir):
    tasks = [Task.from_record(write_task("alpha", "a.txt", "first"), "alpha"),
             Task.from_record(write_task("beta", "b.txt", "second"), "beta")]
    scripts = {"alpha": [call("write_file", {"path": "a.txt", "content": "first"}), "<answer>done</answer>"],
               "beta": [call("write_file", {"path": "b.txt", "content": "second"}), "<answer>done</answer>"]}

    async def scenario():
        async with SharedToolManager(files_tools(fixture_dir, pool_size=2)) as manager:
            collector = TrajectoryCollector(ScriptedEngine(tokenizer, scripts), tokenizer, manager,
                                            EnvironmentConfig(), RolloutConfig(max_concurrent_episodes=6))
            return await collector.collect(tasks, group_size=3, seed=0)

    result = asyncio.run(scenario())
    assert result.excluded_groups == 0 and len(result.trajectories) == 6
    # Each copy held only its own episode's file: a leftover of another episode fails list_files.
    assert [t.reward for t in result.trajectories] == [1.0] * 6
    assert all(t.success for t in result.trajectories)
    assert sorted(p.name for p in fixture_dir.iterdir()) == ["seed.txt"]


def test_a_pool_that_never_frees_excludes_the_groups_with_the_reason(tokenizer, fixture_dir):
    tasks = [Task.from_record(write_task("alpha", "a.txt", "first"), "alpha")]
    scripts = {"alpha": [call("write_file", {"path": "a.txt", "content": "first"}), "<answer>done</answer>"]}

    async def scenario():
        async with SharedToolManager(files_tools(fixture_dir, pool_size=1, lease_timeout=0.5)) as manager:
            await manager.start_episode("forgotten")  # a caller that never gives its instance back
            collector = TrajectoryCollector(ScriptedEngine(tokenizer, scripts), tokenizer, manager,
                                            EnvironmentConfig(), RolloutConfig(episode_retries=0))
            return await collector.collect(tasks, group_size=2, seed=0)

    result = asyncio.run(scenario())
    assert result.trajectories == [] and result.excluded_groups == 1 and result.failed_episodes == 2
    assert all("LeaseError(\"no instance of stateful server 'files' became free within 0.5 s (pool_size 1; "
               "held by forgotten for" in error for error in result.errors), result.errors


def test_the_environment_leases_at_reset_and_gives_back_at_close_also_after_a_failure(fixture_dir):
    async def scenario():
        async with SharedToolManager(files_tools(fixture_dir, pool_size=1, lease_timeout=0.3)) as manager:
            env = MCPToolEnvironment(manager, EnvironmentConfig(), "ep-1")
            await env.reset(write_task("alpha", "a.txt", "first"))
            # Leased before any call: nobody else gets the only instance while the episode runs.
            other = await manager.call_tool("list_files", {}, episode_id="other")
            assert other.error_kind == "lease"
            step = await env.step(call("write_file", {"path": "a.txt", "content": "first"}))
            assert not step.done
            final = await env.step("<answer>done</answer>")
            assert final.done and final.reward == 1.0
            assert [c["status"] for c in final.info["state_checks"]] == ["ok", "ok"]
            await env.close()

            broken = MCPToolEnvironment(manager, EnvironmentConfig(), "ep-2")
            setup = [{"server": "files", "tool": "no_such_tool"}]
            with pytest.raises(RuntimeError, match="setup tool files.no_such_tool is not offered"):
                await broken.reset(write_task("beta", "b.txt", "second", setup=setup))
            await broken.close()  # what the collector does after a failed episode
            listing = await manager.call_tool("list_files", {}, episode_id="after")
            assert json.loads(listing.text) == ["seed.txt"]

    asyncio.run(scenario())


def test_a_check_on_a_tool_no_server_offers_fails_the_episode_naming_it(fixture_dir):
    task = write_task("alpha", "a.txt", "first")
    task["reward_spec"]["ground_truth"]["success"]["checks"][0]["tool"] = "read_text"

    async def scenario():
        async with SharedToolManager(files_tools(fixture_dir, pool_size=1)) as manager:
            env = MCPToolEnvironment(manager, EnvironmentConfig(), "ep-1")
            await env.reset(task)
            try:
                with pytest.raises(RuntimeError) as caught:
                    await env.step("<answer>done</answer>")
            finally:
                await env.close()
            return str(caught.value)

    assert asyncio.run(scenario()) == ("task alpha: check tool files.read_text is not offered by any configured "
                                       "server (or its allow/deny refuse it)")


def test_kv_fixture_is_every_episodes_initial_state(tmp_path):
    fixture = tmp_path / "seed.json"
    fixture.write_text(json.dumps({"balance": 100, "owner": {"name": "ann"}}))
    kv = {"command": "python", "args": ["-m", "tools.servers.kv", "--fixture", str(fixture)], "cwd": str(REPO),
          "startup_timeout": 60}

    async def scenario():
        async with SharedToolManager(ToolsConfig(servers={"kv": kv})) as manager:
            await manager.call_tool("put", {"key": "balance", "value": 5}, episode_id="a")
            await manager.call_tool("put", {"key": "owner", "value": "bob"}, episode_id="b")
            a, b = [(await manager.call_tool("dump", {}, episode_id=e)).structured for e in ("a", "b")]
            assert a == {"state": {"balance": 5, "owner": {"name": "ann"}}}
            assert b == {"state": {"balance": 100, "owner": "bob"}}
            await manager.call_tool("reset", {}, episode_id="a")
            again = await manager.call_tool("dump", {}, episode_id="a")
            assert again.structured == {"state": {"balance": 100, "owner": {"name": "ann"}}}

    asyncio.run(scenario())
    assert json.loads(fixture.read_text()) == {"balance": 100, "owner": {"name": "ann"}}

    fixture.write_text("[1, 2]")

    async def bad_fixture():
        async with SharedToolManager(ToolsConfig(servers={"kv": kv})):
            pass

    with pytest.raises(ToolServerStartError) as caught:
        asyncio.run(bad_fixture())
    assert caught.value.stderr_tail.strip() == f"kv: the fixture {fixture} must hold a JSON object of keys and values, not a list"
