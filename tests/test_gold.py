"""Gold turns written from the episode's own results (grpo/train/gold.py): picked arguments and
`answer_from` answers come from what this episode's calls returned, never from the values recorded
when the task was generated; a gold turn that cannot be written fails only its own episode."""

from __future__ import annotations

import json

import pytest

from environments.rewards import CallRecord
from environments.tasks.picks import PickError
from environments.tasks.schema import Task
from grpo.rollout.base import GenerationRequest, SamplingParams
from grpo.train.gold import CHECKS_ONLY_ANSWER, GoldPlayer, gold_answer, gold_script, gold_turn

BERLIN = json.dumps({"timezone": "Europe/Berlin", "datetime": "2026-11-27T20:15:44+01:00", "day_of_week": "Friday"})
TOKYO = json.dumps({"source": {"timezone": "Europe/Berlin", "datetime": "2026-11-27T20:15:00+01:00"},
                    "target": {"timezone": "Asia/Tokyo", "datetime": "2026-11-28T04:15:00+09:00",
                               "day_of_week": "Saturday"}, "time_difference": "+8.0h"})

CLOCK = Task.from_record({
    "prompt": [{"role": "user", "content": "Look up the time in Berlin and convert it to Tokyo. What date and time is it there?"}],
    "reward_spec": {"method": ["success"], "ground_truth": {
        "task_id": "clock", "complexity": "medium",
        "success": {"must_call_tool": True, "answer_from": {"step": 2, "field": "target.datetime"}},
        "tool_sequence": [
            {"server": "time", "tool": "get_current_time", "params": {"timezone": "Europe/Berlin"}},
            {"server": "time", "tool": "convert_time",
             "params": {"source_timezone": "Europe/Berlin", "time": "17:59", "target_timezone": "Asia/Tokyo"},
             "picks": {"time": {"step": 1, "field": "datetime", "pattern": r"T(\d\d:\d\d)"}}}]}}}, "clock")

WRITE = Task.from_record({
    "prompt": [{"role": "user", "content": "Create notes/a.txt saying hi."}],
    "reward_spec": {"method": ["success"], "ground_truth": {
        "task_id": "write", "complexity": "easy",
        "success": {"must_call_tool": True, "checks": [
            {"server": "fs", "tool": "read_text_file", "params": {"path": "notes/a.txt"}, "expect": "hi"}]},
        "tool_sequence": [{"server": "fs", "tool": "write_file", "params": {"path": "notes/a.txt", "content": "hi"}}]}}},
    "write")


def _ok(tool: str, result: str, server: str = "time") -> CallRecord:
    return CallRecord(tool, {}, "ok", tool=tool, exposed_name=tool, server=server, result=result, turn=1)


def _calls(turn: str) -> str:
    return json.loads(turn.removeprefix("<tool_call>").removesuffix("</tool_call>"))


def test_a_picked_argument_is_what_this_episodes_earlier_call_returned():
    first = gold_turn(CLOCK, 0, [])
    assert _calls(first) == {"name": "get_current_time", "arguments": {"timezone": "Europe/Berlin"}}
    second = gold_turn(CLOCK, 1, [_ok("get_current_time", BERLIN)])
    # 20:15 is the episode's clock; 17:59 (recorded at generation) would be stale.
    assert _calls(second)["arguments"] == {"source_timezone": "Europe/Berlin", "time": "20:15",
                                           "target_timezone": "Asia/Tokyo"}
    # A failed call is no result; the last successful one counts.
    failed = CallRecord("get_current_time", {}, "tool_error", tool="get_current_time", server="time", result="boom")
    assert _calls(gold_turn(CLOCK, 1, [_ok("get_current_time", BERLIN), failed]))["arguments"]["time"] == "20:15"


def test_an_answer_from_the_episodes_call_is_what_that_call_returned():
    calls = [_ok("get_current_time", BERLIN), _ok("convert_time", TOKYO)]
    assert gold_turn(CLOCK, 2, calls) == "<answer>2026-11-28T04:15:00+09:00</answer>"
    with pytest.raises(ValueError, match="its answer comes from step 2's result \\(field 'target.datetime'\\)"):
        gold_answer(CLOCK, calls[:1])
    with pytest.raises(IndexError, match="the gold script has 3 turns, turn 4 was asked for"):
        gold_turn(CLOCK, 3, calls)


def test_a_task_scored_on_its_end_state_answers_done():
    assert gold_script(WRITE) == [
        '<tool_call>{"name": "write_file", "arguments": {"path": "notes/a.txt", "content": "hi"}}</tool_call>',
        f"<answer>{CHECKS_ONLY_ANSWER}</answer>"]


class _Env:
    """What the player reads of an environment: its task and its episode's calls."""

    def __init__(self, task, calls):
        self.task = task
        self.episode = type("Episode", (), {"calls": calls})()


def test_the_player_writes_each_episodes_turn_and_fails_only_the_episode_it_cannot_write():
    player = GoldPlayer()
    player.envs = {"e1": _Env(CLOCK, [_ok("get_current_time", BERLIN)]),
                   "e2": _Env(CLOCK, [_ok("get_current_time", "no clock here")])}
    request = GenerationRequest([1], SamplingParams(), task_id="clock", turn=1, session="e1")
    assert _calls(player(request))["arguments"]["time"] == "20:15"
    request.session = "e2"
    assert player(request) == "<answer></answer>" and list(player.failures) == ["e2"]
    assert "task 'clock' turn 2" in player.failures["e2"]
    with pytest.raises(PickError):  # the same problem, outside the player, is an error
        gold_turn(CLOCK, 1, [_ok("get_current_time", "no clock here")])
    request.session = "e3"
    with pytest.raises(KeyError, match="no episode 'e3' for task 'clock'"):
        player(request)
    player.forget()
    assert player.envs == {} and player.failures == {}
