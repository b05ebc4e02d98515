"""Exploration by observed effect (environments/taskgen/observe.py) on a notes app that declares
no annotations but a false one (tests/servers/notes.py, whose writes log their calls): on a
confined, disposable copy every tool is called and classified by what its call did; a server
whose data lives outside its copy is not trusted (and the user's files are untouched); without
disposable state only declared reads are called."""

from __future__ import annotations

import asyncio
import json

import pytest
from conftest import REPO

from environments.taskgen.families.base import Explorer
from environments.taskgen.observe import explore
from environments.taskgen.run import generate_tasks
from tools.cage.command import kernel_problem
from tools.config import MCPServerConfig, StateConfig, ToolsConfig
from tools.manager import SharedToolManager

NOTES = str(REPO / "tests/servers/notes.py")


def _manager(loop, data: str, state: StateConfig | None = None, **server) -> SharedToolManager:
    config = MCPServerConfig(command="python", args=[NOTES, "--data", data], state=state, **server)
    manager = SharedToolManager(ToolsConfig(servers={"notes": config}))
    loop.run_until_complete(manager.start())
    return manager


def _effects(loop, tools) -> dict:
    found = loop.run_until_complete(explore(tools, "notes"))
    return found, {tool: (e.kind, e.callable) for tool, e in found.effects.items()}


@pytest.fixture
def caged(tmp_path):
    problem = kernel_problem()
    if problem:
        pytest.skip(problem)
    return StateConfig(fixture=str(tmp_path / "fixture"), reset="copy", pool_size=2, isolation="landlock")


def test_every_tool_is_classified_by_what_its_call_did_to_the_copy(loop, tmp_path, caged):
    (tmp_path / "fixture").mkdir()
    tools = _manager(loop, "{state_dir}", caged)
    try:
        found, effects = _effects(loop, tools)
    finally:
        loop.run_until_complete(tools.close())
    assert effects == {"list_notes": ("read", True), "get_note": ("read", True), "counter": ("read", True),
                       "add_note": ("write", True), "finish_note": ("write", True), "delete_note": ("write", True),
                       "tidy": ("write", True),      # declares readOnlyHint, saves the file: the observed write decides
                       "bump": ("write", False)}     # in memory only: reset: copy would carry it into the next episode
    reasons = {tool: e.reason for tool, e in found.effects.items()}
    assert reasons["add_note"] == "observed: its call changed calls.jsonl, notes.json in the copy"
    assert reasons["tidy"].endswith("(it declares readOnlyHint: what it did decides)")
    assert reasons["bump"].startswith("observed: after its call counter read differently, and the copy did not change")
    assert "use tools.servers.notes.state.reset: restart" in reasons["bump"]
    assert found.problem is None and found.observable
    assert not (tmp_path / "fixture" / "calls.jsonl").exists()  # every write went to a copy


def test_with_reset_restart_a_change_kept_in_memory_is_undone_and_may_be_called(loop, tmp_path, caged):
    (tmp_path / "fixture").mkdir()
    tools = _manager(loop, "{state_dir}", caged.model_copy(update={"reset": "restart"}))
    try:
        found, effects = _effects(loop, tools)
    finally:
        loop.run_until_complete(tools.close())
    assert effects["bump"] == ("write", True) and "a fresh episode starts without it" in found.effects["bump"].reason


def test_a_server_whose_data_lives_outside_its_copy_is_not_trusted_and_its_files_are_untouched(loop, tmp_path, caged):
    (tmp_path / "fixture").mkdir()
    real = tmp_path / "real"
    real.mkdir()
    (real / "notes.json").write_text(json.dumps([{"id": 7, "title": "Mine", "body": "keep", "done": False,
                                                  "created": "2024-12-01T08:00:00"}]))
    before = (real / "notes.json").read_bytes()
    tools = _manager(loop, str(real), caged)
    try:
        found, effects = _effects(loop, tools)
        outcome = loop.run_until_complete(generate_tasks(tools, servers=["notes"], num=6, max_steps=2, seed=0,
                                                         eval_tasks=0, novel_tasks=0, examples=0))
    finally:
        loop.run_until_complete(tools.close())
    assert (real / "notes.json").read_bytes() == before and sorted(p.name for p in real.iterdir()) == ["notes.json"]
    assert found.problem.startswith("its data does not seem to live in {state_dir}: calls of add_note, delete_note, "
                                    "finish_note, tidy were refused writing outside the copy")
    assert not found.observable
    assert {t: e for t, e in effects.items() if e[1]} == {"list_notes": ("read", True), "get_note": ("read", True),
                                                          "counter": ("read", True), "tidy": ("read", True)}
    reasons = {t["tool"]: t["reason"] for t in outcome.report["tools_left_out"]}
    assert "Permission denied" in reasons["add_note"]
    assert outcome.report["servers"]["notes"]["problem"] == found.problem


def test_without_disposable_state_only_declared_reads_are_called(loop, tmp_path):
    tools = _manager(loop, str(tmp_path), read_only=["list_*", "get_note"])
    try:
        found, effects = _effects(loop, tools)
        loop.run_until_complete(generate_tasks(tools, servers=["notes"], num=6, max_steps=2, seed=0,
                                               eval_tasks=0, novel_tasks=0, examples=0))
    finally:
        loop.run_until_complete(tools.close())
    assert {t for t, e in effects.items() if e[1]} == {"list_notes", "get_note", "tidy"}
    # tidy declares readOnlyHint and is trusted where nothing can be observed (docs/servers.md):
    # it is the only tool that wrote; no undeclared tool was called.
    calls = [json.loads(line)["tool"] for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
    assert set(calls) == {"tidy"}
    assert found.effects["add_note"].reason.startswith("may write (declares no annotations) and server 'notes' has no "
                                                       "per-episode state")
    assert '`tools.servers.notes.read_only: ["add_note"]`' in found.effects["add_note"].reason
    assert found.effects["list_notes"].reason == "declared read-only (tools.servers.notes.read_only: 'list_*')"


def test_a_pool_of_one_instance_serves_exploring_and_its_probes(loop, tmp_path, caged):
    # Exploring's reads hold one episode; a probe needs a fresh copy of its own. With one instance
    # the probe must not wait for the episode its own explorer holds (it waited out lease_timeout).
    (tmp_path / "fixture").mkdir()
    one = caged.model_copy(update={"pool_size": 1, "lease_timeout": 5.0})
    tools = _manager(loop, "{state_dir}", one)
    try:
        found = loop.run_until_complete(explore(tools, "notes"))
        explorer = Explorer(tools, "notes", found)

        async def read_probe_read():
            first = await explorer.call("list_notes", {})
            (added,), changed = await explorer.probe([("add_note", {"title": "milk", "body": "two litres"})])
            return first, added, changed, await explorer.call("list_notes", {})

        first, added, changed, again = loop.run_until_complete(asyncio.wait_for(read_probe_read(), 30))
        loop.run_until_complete(explorer.close())
    finally:
        loop.run_until_complete(tools.close())
    assert added is not None and "milk" not in first
    assert sorted(changed) == ["calls.jsonl", "notes.json"]
    assert again == first  # the probe's note stayed in the probe's copy
