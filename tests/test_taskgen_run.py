"""The generation loop: an interrupted run continues from its progress file without repeating a
request, and the report says per server what it made (tests/servers/recorder.py: read tools)."""

from __future__ import annotations

import json
import time

import pytest
from conftest import REPO

from environments.taskgen.run import generate_tasks
from tools.config import MCPServerConfig, ToolsConfig
from tools.manager import SharedToolManager


@pytest.fixture(scope="module")
def tools(loop, tmp_path_factory):
    log = tmp_path_factory.mktemp("recorder") / "calls.jsonl"
    config = MCPServerConfig(command="python", args=[str(REPO / "tests/servers/recorder.py"), "--log", str(log)])
    manager = SharedToolManager(ToolsConfig(servers={"recorder": config}))
    loop.run_until_complete(manager.start())
    yield manager
    loop.run_until_complete(manager.close())


def _generate(loop, tools, num, progress=None):
    return loop.run_until_complete(generate_tasks(tools, servers=["recorder"], num=num, max_steps=2, seed=4,
                                                  eval_tasks=0, novel_tasks=0, examples=0, progress=progress))


def test_an_interrupted_run_continues_where_it_stopped(loop, tools, tmp_path):
    progress = tmp_path / "tasks.progress.jsonl"
    first = _generate(loop, tools, 5, progress)
    written = [json.loads(line) for line in progress.read_text().splitlines()]
    assert [r["prompt"] for r in written] == [r["prompt"] for r in first.records]
    # The same command with a larger target keeps the five tasks made and adds new ones.
    second = _generate(loop, tools, 9, progress)
    requests = [r["prompt"][0]["content"] for r in second.records]
    assert len(requests) == 9 == len(set(requests))
    assert requests[:5] == [r["prompt"][0]["content"] for r in first.records]
    assert len(progress.read_text().splitlines()) == 9


def test_the_report_counts_tasks_templates_and_multi_call_share(loop, tools):
    outcome = _generate(loop, tools, 10)
    row = outcome.report["servers"]["recorder"]
    multi = sum(r["extra_info"]["chain_length"] > 1 for r in outcome.records)
    assert row["family"] == "generic" and row["tasks"] == 10
    assert row["multi_call_share"] == round(multi / 10, 3) and row["templates"] == 4
    assert row["answer_or_state_share"] == 1.0 and row["request_shapes"] == len(
        {(r["extra_info"]["template"], tuple(s["tool"] for s in r["reward_spec"]["ground_truth"]["tool_sequence"]))
         for r in outcome.records})
    used = {t["tool"]: t["tasks"] for t in outcome.report["tools_used"]}
    assert set(used) <= {"list_items", "get_item"} and sum(used.values()) == sum(
        r["extra_info"]["chain_length"] for r in outcome.records)


def _generate_over(loop, count: int) -> tuple[float, object]:
    config = MCPServerConfig(command="python", args=[str(REPO / "tests/servers/many.py"), "--count", str(count)],
                             startup_timeout=120)
    manager = SharedToolManager(ToolsConfig(servers={"many": config}))
    loop.run_until_complete(manager.start())
    try:
        started = time.perf_counter()
        outcome = loop.run_until_complete(generate_tasks(manager, servers=["many"], num=10, max_steps=2, seed=0,
                                                         eval_tasks=0, novel_tasks=0, examples=0))
        return time.perf_counter() - started, outcome
    finally:
        loop.run_until_complete(manager.close())


def test_generation_considers_every_one_of_two_thousand_tools_in_linear_time(loop):
    small, _ = _generate_over(loop, 500)
    seconds, outcome = _generate_over(loop, 2000)
    reported = {t["tool"] for t in outcome.report["tools_used"]} | {t["tool"] for t in outcome.report["tools_left_out"]}
    assert len(reported) == 2000 and len(outcome.report["tools"]["many"]) == 2000  # every tool considered
    assert len(outcome.records) == 10
    # Four times the tools: linear work takes about four times as long, quadratic sixteen (side by
    # side, so the machine's load weighs on both).
    assert seconds < 8 * small, (small, seconds)


def test_broken_schemas_are_reported_and_the_rest_goes_on(loop):
    config = MCPServerConfig(command="python", args=[str(REPO / "tests/servers/odd_schemas.py")])
    manager = SharedToolManager(ToolsConfig(servers={"odd": config}))
    loop.run_until_complete(manager.start())
    try:
        outcome = loop.run_until_complete(generate_tasks(manager, servers=["odd"], num=3, max_steps=2, seed=0,
                                                         eval_tasks=0, novel_tasks=0, examples=0))
    finally:
        loop.run_until_complete(manager.close())
    tools = outcome.report["tools"]["odd"]
    assert set(tools) == {"backwards", "nothing", "choices", "worded", "deep", "fine"}
    # No traceback: what no value can be made for is reported; the rest made tasks.
    for broken in ("nothing", "choices", "deep"):
        assert "its schema gives no value for a required argument" in tools[broken]["how"], tools[broken]
    assert outcome.records and {s["tool"] for r in outcome.records
                                for s in r["reward_spec"]["ground_truth"]["tool_sequence"]} <= set(tools)
