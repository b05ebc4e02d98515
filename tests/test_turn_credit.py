"""Verified turn credit (environments/turn_credit.py, environments/mcp_tool/replay.py): episodes
played by a script against the real calculator and kv servers, each call judged by replaying the
episode on fresh state; and the pure parts (alignment, units, the gold step in context)."""

from __future__ import annotations

import asyncio
import json

import pytest
from conftest import REPO, running_manager

from environments.alignment import align
from environments.config import EnvironmentConfig
from environments.mcp_tool.env import MCPToolEnvironment
from environments.rewards import CallRecord
from environments.tasks.schema import Task, ToolStep
from environments.toolcalls import format_tool_call
from environments.turn_credit import CreditUnit, credit_units, gold_arguments
from grpo.collect.episode import EpisodeRecord
from tools.config import ToolsConfig
from tools.manager import SharedToolManager

VERIFIED = EnvironmentConfig(turn_credit="verified", one_shot_example=False)


@pytest.fixture(scope="module")
def tools(loop):
    with running_manager(loop, "calculator", "kv") as manager:
        yield manager


def chain_task() -> Task:
    """91 * 59, stored under "subtotal"; that plus 14, stored under "alpha" and answered."""
    steps = [
        {"server": "calculator", "tool": "calculate", "params": {"expression": "91 * 59"}},
        {"server": "kv", "tool": "put", "params": {"key": "subtotal", "value": 5369}, "uses": {"value": "{1}"}},
        {"server": "calculator", "tool": "calculate", "params": {"expression": "5369 + 14"},
         "uses": {"expression": "{1} + 14"}},
        {"server": "kv", "tool": "put", "params": {"key": "alpha", "value": 5383}, "uses": {"value": "{3}"}},
    ]
    record = {"data_source": "test", "prompt": [{"role": "user", "content": "Chain it."}],
              "reward_spec": {"method": ["success", "process"], "ground_truth": {
                  "task_id": "chain", "complexity": "hard",
                  "success": {"answer": 5383, "state": {"kv": {"subtotal": 5369, "alpha": 5383}}},
                  "tool_sequence": steps}}}
    return Task.from_record(record, "test")


def calc(expression: str) -> str:
    return format_tool_call("calculate", {"expression": expression}, "hermes")


def put(key: str, value) -> str:
    return format_tool_call("put", {"key": key, "value": value}, "hermes")


def play(loop, tools, texts: list[str], config: EnvironmentConfig = VERIFIED):
    async def run():
        env = MCPToolEnvironment(tools, config, "credit-episode")
        await env.reset(chain_task())
        result = None
        for text in texts:
            result = await env.step(text)
            if result.done:
                break
        await env.close()
        return env, result

    return loop.run_until_complete(run())


def units_of(result) -> list[list]:
    return result.info["turn_credit"]["units"]


def test_another_correct_route_scores_as_correct(loop, tools):
    # The operands swapped, the stored value as a string, the second expression written differently:
    # none of it is the gold's argument text, all of it has the gold's effect.
    _, result = play(loop, tools, [calc("59*91"), put("subtotal", "5369"), calc("14 + 5369"), put("alpha", 5383),
                                     "<answer>5383</answer>"])
    assert result.info["success"]
    assert units_of(result) == [[1, 1.0, "progress=0"], [2, 1.0, "progress=1"], [3, 1.0, "progress=2"],
                                [4, 1.0, "progress=3"]]
    credit = result.info["turn_credit"]
    assert credit["steps_done"] == 4 and credit["judged_by_arguments"] == 0
    assert credit["forks"] >= 1 and credit["calls"] > 0 and credit["seconds"] > 0


def test_a_right_call_after_a_wrong_one_and_a_wrong_key(loop, tools):
    _, result = play(loop, tools, [calc("91 * 58"), calc("91 * 59"), put("subtotal", 5369), put("beta", 5383),
                                   "<answer>5383</answer>"])
    assert not result.info["success"]
    # The wrong product does no step; the right one after it does step 1 (the key stays: nothing
    # was done before either); the put under a wrong key does nothing the gold would.
    assert units_of(result) == [[1, 0.0, "progress=0"], [2, 1.0, "progress=0"], [3, 1.0, "progress=1"],
                                [4, 0.0, "progress=2"]]


def test_a_call_that_rightly_chains_a_wrong_result_keeps_its_credit(loop, tools):
    # 91 * 58 is the wrong first step, but storing what it returned is what step 2 does with it.
    _, result = play(loop, tools, [calc("91 * 58"), put("subtotal", 5278), "<answer>5278</answer>"])
    assert units_of(result) == [[1, 0.0, "progress=0"], [2, 1.0, "progress=0"]]


def test_a_repeated_step_an_error_and_unreadable_markup_score_zero(loop, tools):
    _, result = play(loop, tools, [calc("91 * 59"), calc("91 * 59"), calc("1 / 0"), "<tool_call>{oops</tool_call>",
                                   "<answer>5369</answer>"])
    assert units_of(result) == [[1, 1.0, "progress=0"], [2, 0.0, "progress=1"], [3, 0.0, "progress=1"],
                                [4, 0.0, "progress=1"]]


def test_the_replays_leave_the_episode_and_no_state_behind(loop, tools):
    _, result = play(loop, tools, [calc("91*59"), put("subtotal", 5369), "<answer>5369</answer>"])
    assert result.info["state"] == {"kv": {"subtotal": 5369}}  # read before any replay ran

    async def dump(episode_id):
        spec = next(s for s in tools.tool_specs() if s.tool == "dump")
        return (await tools.call_tool(spec.name, {}, episode_id=episode_id)).text

    assert '"state": {}' in loop.run_until_complete(dump("credit-episode"))


def test_off_by_default_and_for_tasks_without_a_chain(loop, tools):
    _, result = play(loop, tools, [calc("91 * 59"), "<answer>5369</answer>"], EnvironmentConfig(one_shot_example=False))
    assert "turn_credit" not in result.info


def test_units_land_on_their_turns_tokens():
    record = EpisodeRecord(task=None, task_id="t", group_id="g", sample_index=0, episode_id="e")
    record.start([5, 5, 5], [], 100)
    record.add_sampled([1, 1], [0.0, 0.0], "stop")
    record.add_observation([7])
    record.add_sampled([1, 1, 1], [0.0] * 3, "stop")
    record.info = {"turn_credit": {"units": [[1, 1.0, "progress=0"], [2, 0.0, "progress=1"]]}}
    spans = record.credit_spans()
    assert [(s.start, s.end, s.score, s.key) for s in spans] == [(3, 5, 1.0, "progress=0"), (6, 9, 0.0, "progress=1")]
    record.info = {"turn_credit": {"units": [[3, 1.0, "progress=0"]]}}
    with pytest.raises(ValueError, match="a credit unit names turn 3, but 2 turn"):
        record.credit_spans()


# -- the pure parts ----------------------------------------------------------------------------

def call(tool: str, turn: int, status: str = "ok", result: str = "", **arguments) -> CallRecord:
    return CallRecord(tool, arguments, status, tool=tool, exposed_name=tool, server="s", result=result, turn=turn)


def test_align_keeps_both_orders_and_prefers_earlier_calls():
    verified = {(0, 0), (0, 1), (1, 1), (1, 2), (2, 0)}
    # Three matches are impossible in order ((2, 0) comes before step 0's call); two: call 0 and 1.
    assert align(3, 3, lambda s, c: float((s, c) in verified)) == (2.0, {0: 0, 1: 1})
    assert align(2, 0, lambda s, c: 1.0) == (0.0, {})
    assert align(1, 3, lambda s, c: float(c >= 1)) == (1.0, {1: 0})
    # Weighted: the larger total wins over the larger count (0.9 + 0.9 < 2.5), and 0 is no match.
    weights = {(0, 0): 0.9, (1, 1): 0.9, (0, 1): 2.5}
    assert align(2, 2, lambda s, c: weights.get((s, c), 0.0)) == (2.5, {1: 0})


def test_credit_units_key_on_the_progress_before_them():
    calls = [call("a", 1), call("b", 1), call("a", 3, "invalid"), call("c", 4)]
    assert credit_units(calls, {0, 3}, [2, 3]) == [
        CreditUnit(1, 1.0, "progress=0"), CreditUnit(1, 0.0, "progress=1"), CreditUnit(2, 0.0, "progress=1"),
        CreditUnit(3, 0.0, "progress=1"), CreditUnit(3, 0.0, "progress=1"), CreditUnit(4, 1.0, "progress=1")]


def test_gold_arguments_come_from_the_episodes_own_results():
    steps = chain_task().reward_spec.ground_truth.tool_sequence
    earlier = [CallRecord("calculate", {"expression": "91*58"}, "ok", tool="calculate", server="calculator",
                          result="5278")]
    assert gold_arguments(steps[1], steps, earlier) == {"key": "subtotal", "value": "5278"}
    assert gold_arguments(steps[2], steps, earlier) == {"expression": "5278 + 14"}
    # A reference the episode never produced keeps the recorded value.
    assert gold_arguments(steps[1], steps, []) == {"key": "subtotal", "value": 5369}
    assert gold_arguments(ToolStep(tool="x", params={"a": 1}), steps, earlier) == {"a": 1}


# -- a server whose state is a directory per episode (tools/state.py) -----------------------------

def test_on_a_one_instance_pool_the_episode_gives_back_first_and_writes_are_judged_by_the_copy(tmp_path):
    """A file written through another spelling of its path does the gold write; a file with other
    content does not; a read that changes nothing is judged by its result. One instance only: the
    replays lease it after the episode has given it back."""
    fixture = tmp_path / "fixture"
    fixture.mkdir()
    (fixture / "seed.txt").write_text("seed")
    server = {"command": "python", "args": [str(REPO / "tests" / "servers" / "files.py")], "startup_timeout": 60,
              "state": {"fixture": str(fixture), "reset": "copy", "pool_size": 1, "lease_timeout": 5}}
    steps = [{"server": "files", "tool": "read_file", "params": {"path": "seed.txt"}},
             {"server": "files", "tool": "write_file", "params": {"path": "notes/a.txt", "content": "seed"},
              "uses": {"content": "{1}"}}]
    task = {"prompt": [{"role": "user", "content": "Copy seed.txt to notes/a.txt."}],
            "reward_spec": {"method": ["state"], "ground_truth": {
                "task_id": "copy", "complexity": "medium", "tool_sequence": steps,
                "success": {"checks": [{"server": "files", "tool": "read_file", "params": {"path": "notes/a.txt"},
                                        "expect": "seed"}]}}}}

    def write(path, content):
        return f"<tool_call>{json.dumps({'name': 'write_file', 'arguments': {'path': path, 'content': content}})}</tool_call>"

    read = '<tool_call>{"name": "read_file", "arguments": {"path": "./seed.txt"}}</tool_call>'

    async def scenario():
        async with SharedToolManager(ToolsConfig(servers={"files": server})) as manager:
            results = []
            for n, texts in enumerate([[read, write("./notes/../notes/a.txt", "seed"), "<answer>done</answer>"],
                                       [read, write("notes/a.txt", "SEED!"), "<answer>done</answer>"]]):
                env = MCPToolEnvironment(manager, VERIFIED, f"pool-{n}")
                await env.reset(task)
                for text in texts:
                    result = await env.step(text)
                await env.close()
                results.append(result)
            after = await manager.call_tool("list_files", {}, episode_id="after")
            return results, json.loads(after.text)

    (right, wrong), listing = asyncio.run(scenario())
    assert right.info["success"] and units_of(right) == [[1, 1.0, "progress=0"], [2, 1.0, "progress=1"]]
    assert not wrong.info["success"] and units_of(wrong) == [[1, 1.0, "progress=0"], [2, 0.0, "progress=1"]]
    assert right.info["turn_credit"]["judged_by_arguments"] == 0
    assert listing == ["seed.txt"]  # every fork's copy went back to the fixture
