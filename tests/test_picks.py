"""Arguments picked from earlier results (environments/tasks/picks.py): what each part of a pick
takes from a result, the errors that name what is missing, the schema's checks, and the process
reward crediting the value the model's own earlier call gives."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from environments.process_reward import process_score, step_credit
from environments.rewards import CallRecord, Episode
from environments.tasks.picks import Picked, PickError, pick_value, picked_arguments
from environments.tasks.schema import Task

LOG = ("Commit history:\nCommit: " + "a" * 40 + "\nAuthor: Ada\nDate: 2024-03-25\nMessage: Add shears\n\n\n"
       "Commit: " + "b" * 40 + "\nAuthor: Ben\nDate: 2024-03-23\nMessage: Add a fourth plot\n")
CLOCK = json.dumps({"timezone": "Europe/Berlin", "datetime": "2026-11-27T20:15:44+01:00", "day_of_week": "Friday"})
GRAPH = json.dumps({"entities": [{"name": "Ada", "type": "person", "tags": ["chess"]},
                                 {"name": "Acme", "type": "company", "tags": ["tools"]}]})


def test_without_select_or_field_the_value_is_the_text():
    assert pick_value(Picked(step=1), "  Idea: a birdhouse.\n") == "Idea: a birdhouse."
    assert pick_value(Picked(step=1), "42") == "42"  # a file's text stays text


def test_a_field_reads_json_and_the_python_literals_some_servers_print():
    assert pick_value(Picked(step=1, field="0.id"), "[{'id': 2}]") == 2  # a number stays a number
    assert pick_value(Picked(step=1, field="0.id", format="SELECT * FROM orders WHERE product_id = {}"),
                      "[{'id': 2}]") == "SELECT * FROM orders WHERE product_id = 2"
    with pytest.raises(PickError, match="the result has no '0.name' \\(stopped at 'name'\\)"):
        pick_value(Picked(step=1, field="0.name"), "[{'id': 2}]")


def test_a_pattern_takes_its_group_and_must_give_one_value():
    assert pick_value(Picked(step=1, field="datetime", pattern=r"T(\d\d:\d\d)"), CLOCK) == "20:15"
    shears = Picked(step=1, pattern=r"^Commit: ([0-9a-f]{40})\nAuthor: .*\nDate: .*\nMessage: Add shears[ \t]*$",
                    format="{}~1:tools.txt")
    assert pick_value(shears, LOG) == "a" * 40 + "~1:tools.txt"
    with pytest.raises(PickError, match="gives 2 different values, not one"):
        pick_value(Picked(step=1, pattern=r"Commit: ([0-9a-f]{40})"), LOG)
    with pytest.raises(PickError, match="gives 0 different values"):
        pick_value(Picked(step=1, pattern="Message: Remove the shed"), LOG)


def test_select_chooses_the_one_item_whose_key_has_the_value():
    company = {"path": "entities", "key": "type", "value": "company"}
    assert pick_value(Picked(step=1, select=company, field="name"), GRAPH) == "Acme"
    assert pick_value(Picked(step=1, select=company, field="tags.0"), GRAPH) == "tools"
    with pytest.raises(PickError, match='0 items of entities have type = "robot", not one'):
        pick_value(Picked(step=1, select={**company, "value": "robot"}, field="name"), GRAPH)


def test_picked_arguments_fill_dotted_places_and_leave_the_rest():
    params = {"path": "a.txt", "edits": [{"oldText": "x", "newText": "old"}], "files": ["stale"]}
    picks = {"edits.0.newText": Picked(step=1), "files.0": Picked(step=2, field="0.name")}
    results = {1: "fresh\n", 2: "[{'name': 'b.txt'}]"}
    filled = picked_arguments(params, picks, results.get)
    assert filled == {"path": "a.txt", "edits": [{"oldText": "x", "newText": "fresh"}], "files": ["b.txt"]}
    assert params["files"] == ["stale"]  # the task's own params are not touched
    with pytest.raises(PickError, match="files.0 comes from step 2, which has no result yet"):
        picked_arguments(params, picks, {1: "fresh"}.get)


def test_the_schema_refuses_bad_picks_by_name():
    with pytest.raises(ValidationError, match="is no regular expression"):
        Picked(step=1, pattern="(unclosed")
    with pytest.raises(ValidationError, match="has no {} where the picked value goes"):
        Picked(step=1, format="SELECT 1")
    record = _clock_task(picks_from=2)
    with pytest.raises(ValueError, match="tool_sequence.1.picks.time.step is 2: not an earlier step"):
        Task.from_record(record, "clock")


def _clock_task(picks_from: int = 1, stale: str = "19:28") -> dict:
    return {"prompt": [{"role": "user", "content": "Look up the time in Berlin, convert it to Tokyo."}],
            "reward_spec": {"method": ["process"], "ground_truth": {
                "task_id": "clock", "complexity": "medium",
                "tool_sequence": [
                    {"server": "time", "tool": "get_current_time", "params": {"timezone": "Europe/Berlin"}},
                    {"server": "time", "tool": "convert_time",
                     "params": {"source_timezone": "Europe/Berlin", "time": stale, "target_timezone": "Asia/Tokyo"},
                     "picks": {"time": {"step": picks_from, "field": "datetime", "pattern": r"T(\d\d:\d\d)"}}}]}}}


def _call(tool: str, arguments: dict, result: str = "ok") -> CallRecord:
    return CallRecord(tool, arguments, "ok", tool=tool, exposed_name=tool, server="time", result=result, turn=1)


def test_the_process_reward_credits_the_time_the_episodes_own_clock_read():
    task = Task.from_record(_clock_task(stale="19:28"), "clock")
    steps = task.ground_truth.tool_sequence
    now = _call("get_current_time", {"timezone": "Europe/Berlin"}, CLOCK)  # the episode's clock: 20:15
    fresh = _call("convert_time", {"source_timezone": "Europe/Berlin", "time": "20:15", "target_timezone": "Asia/Tokyo"})
    stale = _call("convert_time", {"source_timezone": "Europe/Berlin", "time": "19:28", "target_timezone": "Asia/Tokyo"})
    assert step_credit(steps[1], fresh, steps, [now]) == 1.0
    # The time recorded when the task was generated is wrong in this episode: 2 of 3 arguments right.
    assert step_credit(steps[1], stale, steps, [now]) == pytest.approx(0.5 + 0.5 * 2 / 3)
    assert process_score(task, Episode(calls=[now, fresh])) == 1.0
    # Without the clock call there is nothing to take the time from: the recorded value is the reference.
    assert step_credit(steps[1], stale, steps, []) == 1.0
