"""Which tools exist and which a prompt shows: a server's allow/deny globs (tools/allowlist.py,
with real subprocess servers) and the task-scoped exposure with seeded distractors
(environments/mcp_tool/exposure.py)."""

from __future__ import annotations

import asyncio
import logging

import pytest
from conftest import REPO
from servers.leaks import no_leftover_server_processes  # noqa: F401 - session-level leak check

from environments.config import EnvironmentConfig, ToolExposureConfig
from environments.mcp_tool.env import MCPToolEnvironment
from environments.mcp_tool.exposure import exposed_specs
from environments.tasks.schema import Task
from tools.config import ToolsConfig
from tools.manager import SharedToolManager, ToolSpec

FILES_SERVER = str(REPO / "tests" / "servers" / "files.py")


def files(tmp_path, **options) -> dict:
    return {"command": "python", "args": [FILES_SERVER], "cwd": str(tmp_path), "startup_timeout": 60, **options}


# -- allow / deny --------------------------------------------------------------------------------

def test_allow_and_deny_decide_what_is_listed_and_callable(tmp_path, caplog):
    async def scenario():
        config = ToolsConfig(servers={"files": files(tmp_path, allow=["read_*", "list_*", "where", "reed_*"],
                                                     deny=["where"])})
        async with SharedToolManager(config) as manager:
            assert [spec.name for spec in manager.tool_specs()] == ["read_file", "list_files"]
            assert {(t.tool, t.reason) for t in manager.refused_tools()} == {
                ("write_file", "not matched by allow"), ("where", "deny 'where'"), ("stamp", "not matched by allow")}
            write = await manager.call_tool("write_file", {"path": "a.txt", "content": "x"})
            assert write.is_error and write.error_kind == "unknown_tool"
            assert write.text == ("tool 'write_file' of server 'files' is not allowed "
                                  "(tools.servers.files: not matched by allow)")
            where = await manager.call_tool("files__where", {})
            assert where.text == "tool 'files__where' of server 'files' is not allowed (tools.servers.files: deny 'where')"
            assert not (tmp_path / "a.txt").exists()
            assert (await manager.call_tool("list_files", {})).text == "[]"

    with caplog.at_level(logging.WARNING, logger="tools.allowlist"):
        asyncio.run(scenario())
    assert [r.getMessage() for r in caplog.records] == [
        "server 'files': allow glob 'reed_*' matches none of its tools (write_file, read_file, list_files, where, stamp)"]


def test_a_denied_tool_does_not_make_another_servers_tool_ambiguous(tmp_path):
    async def scenario():
        config = ToolsConfig(servers={"a": files(tmp_path), "b": files(tmp_path, deny=["read_file"])})
        async with SharedToolManager(config) as manager:
            names = [spec.name for spec in manager.tool_specs()]
            assert "read_file" in names and "a__read_file" not in names  # only a's is left: no clash
            assert "a__write_file" in names and "b__write_file" in names

    asyncio.run(scenario())


def test_an_empty_allow_list_is_a_config_error():
    with pytest.raises(ValueError, match="`allow` is empty, so no tool of this server could be used"):
        ToolsConfig(servers={"x": {"command": "x", "allow": []}})


# -- task-scoped exposure ----------------------------------------------------------------------

SPECS = [ToolSpec(name, server, name.split("__")[-1], "", {"type": "object", "properties": {}})
         for name, server in [("alpha", "s1"), ("beta", "s1"), ("gamma", "s1"), ("s1__delta", "s1"),
                              ("s2__delta", "s2"), ("epsilon", "s2"), ("zeta", "s2"), ("eta", "s2")]]


def task(task_id: str, steps: list[dict], **success) -> Task:
    return Task.from_record({
        "prompt": [{"role": "user", "content": "Do it."}],
        "reward_spec": {"method": ["tool_sequence"], "ground_truth": {
            "task_id": task_id, "complexity": "easy", "tool_sequence": steps, "success": success}}}, task_id)


def names(specs) -> list[str]:
    return [spec.name for spec in specs]


def test_task_exposure_shows_the_needed_tools_plus_seeded_distractors_in_list_order():
    needs = task("t1", [{"tool": "beta"}, {"server": "s2", "tool": "delta"}], must_call_tool=["zeta"])
    config = ToolExposureConfig(exposure="task", distractors=2)
    shown = names(exposed_specs(needs, SPECS, config))
    assert {"beta", "s2__delta", "zeta"} <= set(shown) and len(shown) == 5
    assert shown == [name for name in names(SPECS) if name in shown]  # the manager's order
    # The same draw every time (every episode of a group, every run), a new one for another seed.
    assert all(names(exposed_specs(needs, SPECS, config)) == shown for _ in range(5))
    draws = {tuple(names(exposed_specs(task(f"t{i}", [{"tool": "beta"}]), SPECS, config))) for i in range(30)}
    assert len(draws) > 3 and all("beta" in draw and len(draw) == 3 for draw in draws)

    assert names(exposed_specs(needs, SPECS, config.model_copy(update={"distractors": 0}))) == [
        "beta", "s2__delta", "zeta"]
    assert names(exposed_specs(needs, SPECS, config.model_copy(update={"distractors": 50}))) == names(SPECS)
    assert names(exposed_specs(needs, SPECS, ToolExposureConfig(exposure="all"))) == names(SPECS)
    # A task that names no tool the servers offer sees every tool.
    assert names(exposed_specs(task("t2", [{"tool": "omega"}]), SPECS, config)) == names(SPECS)


def test_the_prompt_of_a_task_scoped_episode_lists_its_tools_and_never_the_internal_ones():
    record = {"prompt": [{"role": "user", "content": "Store 5 under total."}],
              "reward_spec": {"method": ["tool_sequence"], "ground_truth": {
                  "task_id": "kv-1", "complexity": "easy",
                  "tool_sequence": [{"server": "kv", "tool": "put", "params": {"key": "total", "value": 5}}]}}}
    scoped = EnvironmentConfig(tools={"exposure": "task", "distractors": 1}, one_shot_example=False,
                               tool_prompt="compact")
    everything = EnvironmentConfig(one_shot_example=False, tool_prompt="compact")
    servers = {name: {"command": "python", "args": ["-m", f"tools.servers.{name}"], "cwd": str(REPO),
                      "startup_timeout": 60} for name in ("calculator", "kv")}

    async def scenario():
        async with SharedToolManager(ToolsConfig(servers=servers)) as manager:
            async def opening(config, episode_id):
                env = MCPToolEnvironment(manager, config, episode_id)
                try:
                    return await env.reset(record)
                finally:
                    await env.close()

            return await asyncio.gather(opening(scoped, "g-0"), opening(scoped, "g-1"), opening(everything, "a-0"))

    first, second, full = asyncio.run(scenario())
    assert first == second  # a group sees one prompt

    def listed(messages):
        return [line[2:].split("(")[0] for line in messages[0]["content"].splitlines() if line.startswith("- ")]

    assert "put" in listed(first) and len(listed(first)) == 2
    assert set(listed(first)) < {"put", "get", "list", "delete", "calculate"}
    assert listed(full) == ["calculate", "put", "get", "list", "delete"]  # dump and reset never shown
