"""Safe exploration: task generation calls a tool only when it is read-only (and not
open-world), allowed by the user, or on a disposable copy of its server's state. A server whose
tools that may write record every call (tests/servers/recorder.py) proves that generation, the
arithmetic classifier and the conversation import never call them otherwise."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import REPO

from environments.taskgen.catalog import build_catalog
from environments.taskgen.run import generate_tasks
from environments.taskgen.safety import judge
from tools.annotations import ToolAnnotations
from tools.config import MCPServerConfig, ToolsConfig
from tools.manager import SharedToolManager, ToolSpec

WRITERS = {"add_item", "delete_item", "reset", "multiply", "lookup", "fetch_price"}


def _spec(tool: str, annotations: ToolAnnotations | None = None, episode_scoped: bool = False,
          server: str = "s") -> ToolSpec:
    return ToolSpec(tool, server, tool, "", {"type": "object", "properties": {}}, annotations, episode_scoped)


def test_declarations_decide_where_nothing_can_be_observed(tmp_path):
    plain = ToolsConfig(servers={"s": MCPServerConfig(command="x")})
    declared = ToolsConfig(servers={"s": MCPServerConfig(command="x", read_only=["list_*", "get"])})
    read_only, writes = ToolAnnotations(read_only=True), ToolAnnotations(read_only=False, destructive=False)
    assert judge(_spec("get", read_only), plain).callable and not judge(_spec("get", read_only), plain).writes
    # destructiveHint false still writes: not called without a disposable state; the reason names
    # the key that declares a read and the flag that opts a write in.
    for spec in (_spec("commit", writes), _spec("bare")):
        effect = judge(spec, plain)
        assert not effect.callable and effect.kind == "unknown"
        assert f'`tools.servers.s.read_only: ["{spec.tool}"]`' in effect.reason
        assert f"opt in with --allow-tool s.{spec.tool}" in effect.reason
        assert judge(spec, plain, allow=["s.*"]).callable and judge(spec, plain, allow=["s.*"]).writes
        assert judge(spec, plain, level="episode_id").callable  # state kept per episode id: disposable
    # The server's read_only globs declare reads for servers without annotations.
    assert judge(_spec("list_items"), declared).callable and judge(_spec("get"), declared).kind == "read"
    assert judge(_spec("list_items"), declared).reason == "declared read-only (tools.servers.s.read_only: 'list_*')"
    assert not judge(_spec("delete"), declared).callable
    assert judge(_spec("put", episode_scoped=True), plain).callable
    web = _spec("fetch", ToolAnnotations(read_only=True, open_world=True))
    assert not judge(web, plain).callable and "open-world" in judge(web, plain).reason
    assert judge(web, plain, allow=["fetch"]).callable


@pytest.fixture
def recorder(loop, tmp_path):
    log = tmp_path / "calls.jsonl"

    def start(**tools_options) -> SharedToolManager:
        config = MCPServerConfig(command="python", args=[str(REPO / "tests/servers/recorder.py"), "--log", str(log)])
        manager = SharedToolManager(ToolsConfig(servers={"recorder": config}, **tools_options))
        loop.run_until_complete(manager.start())
        managers.append(manager)
        return manager

    managers: list[SharedToolManager] = []
    yield start, log
    for manager in managers:
        loop.run_until_complete(manager.close())


def _calls(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_generation_never_calls_a_tool_that_may_write(loop, recorder):
    start, log = recorder
    tools = start()
    outcome = loop.run_until_complete(generate_tasks(tools, servers=["recorder"], num=8, max_steps=2, seed=0,
                                                     eval_tasks=2, novel_tasks=2, examples=0))
    assert _calls(log) == []
    used = {step["tool"] for r in outcome.records for step in r["reward_spec"]["ground_truth"]["tool_sequence"]}
    assert outcome.records and used <= {"list_items", "get_item"}
    reasons = {t["tool"]: t["reason"] for t in outcome.report["tools_left_out"]}
    assert WRITERS <= set(reasons) <= WRITERS | {"get_item"}  # a read a small run did not need may be left out
    assert all("may write" in reasons[t] for t in WRITERS - {"fetch_price"}) and "open-world" in reasons["fetch_price"]
    assert "may write" not in reasons.get("get_item", "")


def test_the_arithmetic_classifier_probes_no_tool_that_may_write(loop, recorder):
    start, log = recorder
    tools = start()
    # multiply(a, b) is shaped like a calculator and lookup(key) like a load: neither is called.
    assert loop.run_until_complete(build_catalog(tools)) == []
    assert _calls(log) == []


def test_a_tool_the_user_allows_is_called_and_no_other(loop, recorder):
    start, log = recorder
    tools = start()
    outcome = loop.run_until_complete(generate_tasks(tools, servers=["recorder"], num=16, max_steps=2, seed=1,
                                                     eval_tasks=0, novel_tasks=0, examples=0,
                                                     allow=["recorder.add_item"]))
    called = {c["tool"] for c in _calls(log)}
    assert called == {"add_item"}
    left_out = {t["tool"] for t in outcome.report["tools_left_out"] if "may write" in t["reason"]}
    assert left_out == WRITERS - {"add_item", "fetch_price"}
