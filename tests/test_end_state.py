"""Rewards of generated tasks: end-state checks (`success.checks`) and answers taken from the
episode's own calls (`success.answer_from`), on hand-made records with exact expected rewards;
and the errors of records that cannot be scored."""

from __future__ import annotations

import pytest

from environments.end_state import answer_value, recorded_expect, without_fields, without_patterns
from environments.rewards import CallRecord, Episode, score
from environments.tasks.schema import AnswerFrom, Task, TaskDataError


def record(success: dict, methods: list[str], steps: list[dict] | None = None, weights: dict | None = None) -> dict:
    return {"prompt": [{"role": "user", "content": "Do it."}],
            "reward_spec": {"method": methods, "weights": weights or {}, "ground_truth": {
                "task_id": "t", "complexity": "easy", "success": success, "tool_sequence": steps or []}}}


def check(tool: str, expect, match: str = "equals", params: dict | None = None) -> dict:
    return {"server": "fs", "tool": tool, "params": params or {}, "expect": expect, "match": match}


def ran(result: str, structured: dict | None = None, status: str = "ok", tool: str = "read") -> CallRecord:
    return CallRecord(tool, {}, status, tool=tool, exposed_name=tool, server="fs", result=result, structured=structured)


def scored(rec: dict, episode: Episode):
    return score(Task.from_record(rec, "record"), episode)


# -- end-state checks --------------------------------------------------------------------------

def test_checks_score_the_fraction_that_match_and_success_needs_all():
    rec = record({"checks": [check("read", "hello"), check("list", ["a.txt", "seed.txt"])]}, ["state"])
    both = scored(rec, Episode(check_results=[ran(" hello\n"), ran('["a.txt", "seed.txt"]', tool="list")]))
    assert (both.total, both.success, both.checks) == (1.0, True, {"state": True})
    one = scored(rec, Episode(check_results=[ran("hello"), ran('["a.txt", "b.txt", "seed.txt"]', tool="list")]))
    assert (one.total, one.success, one.checks) == (0.5, False, {"state": False})
    failed_call = scored(rec, Episode(check_results=[ran("hello", status="tool_error"), ran('["a.txt", "seed.txt"]')]))
    assert failed_call.total == 0.5
    never_ran = scored(rec, Episode(check_results=[]))
    assert (never_ran.total, never_ran.success) == (0.0, False)


@pytest.mark.parametrize(("expect", "match", "result", "structured", "passes"), [
    ("Hello", "equals", "hello", None, False),                     # text is compared exactly
    ("ell", "contains", "hello world", None, True),
    ({"n": 1}, "equals", '{"n": 1.0}', None, True),                # numbers by value
    ({"n": 1}, "equals", '{"n": true}', None, False),              # true is no number
    ({"n": 1}, "equals", '{"n": 1, "m": 2}', None, False),
    ({"n": 1}, "contains", '{"n": 1, "m": 2}', None, True),
    (["b"], "contains", '["a", "b", "c"]', None, True),
    (["b", "d"], "contains", '["a", "b", "c"]', None, False),
    (["a", "b"], "equals", '["b", "a"]', None, False),              # lists in order
    ({"name": "note"}, "contains", '{"name": "notes.txt"}', None, True),
    ([1, 2], "equals", "not json", {"result": [1, 2]}, True),      # the SDK's wrapper unwrapped
    ({"size": 3}, "equals", "3 bytes", {"size": 3}, True),
    (None, "equals", "null", None, True),
    (7, "equals", "plain text", None, False),                      # no JSON to compare with
])
def test_check_matching(expect, match, result, structured, passes):
    rec = record({"checks": [check("read", expect, match)]}, ["state"])
    assert scored(rec, Episode(check_results=[ran(result, structured)])).success is passes


def test_state_entries_and_checks_are_one_fraction_and_weights_apply():
    rec = record({"state": {"kv": {"total": 5, "name": "x"}}, "checks": [check("read", "hello")], "answer": 5},
                 ["final_answer", "state"], weights={"final_answer": 3.0})
    episode = Episode(final_answer="5", state={"kv": {"total": 5, "name": "y"}}, check_results=[ran("hello")])
    breakdown = scored(rec, episode)
    assert breakdown.components == {"final_answer": 1.0, "state": 2 / 3}
    assert breakdown.total == pytest.approx((3 * 1.0 + 2 / 3) / 4, abs=1e-12)
    assert breakdown.checks == {"final_answer": True, "state": False} and not breakdown.success


def test_recorded_expect_passes_on_the_result_it_was_recorded_from():
    for text, structured in [('["a.txt"]', None), ("Contents of a.txt\n", {"result": "Contents of a.txt\n"}),
                             ('{"size": 3, "mtime": "x"}', {"size": 3, "mtime": "x"})]:
        rec = record({"checks": [check("read", recorded_expect(text, structured))]}, ["state"])
        assert scored(rec, Episode(check_results=[ran(text, structured)])).success


# -- answers from the episode's own calls ------------------------------------------------------

TIME_STEPS = [{"server": "fs", "tool": "now"}, {"server": "fs", "tool": "read"}]


def test_answer_from_compares_with_what_the_episodes_last_call_returned():
    rec = record({"answer_from": {"step": 1, "field": "time"}}, ["final_answer"], TIME_STEPS)
    first = ran('{"time": "10:42", "zone": "UTC"}', tool="now")
    # Compared as a fixed `answer` would be: strings whole, after case, quotes and a final period.
    assert scored(rec, Episode(final_answer="10:42.", calls=[first])).total == 1.0
    assert scored(rec, Episode(final_answer="10:43", calls=[first])).total == 0.0
    later = ran('{"time": "10:43"}', tool="now")
    failed = ran('{"time": "11:00"}', status="tool_error", tool="now")
    # The last successful call counts; a failed call and other tools' results do not.
    episode = Episode(final_answer="10:43", calls=[first, later, failed, ran('{"time": "9:00"}', tool="read")])
    assert scored(rec, episode).total == 1.0
    assert scored(rec, Episode(final_answer="10:42", calls=[])).success is False


def test_answer_from_numbers_nested_fields_and_whole_texts():
    ids = record({"answer_from": {"step": 2, "field": "items.1.id"}}, ["final_answer"], TIME_STEPS)
    result = ran('{"items": [{"id": 4}, {"id": 917}]}')
    assert scored(ids, Episode(final_answer="The id is 917", calls=[result])).total == 1.0
    assert scored(ids, Episode(final_answer="The id is 918", calls=[result])).total == 0.0
    assert scored(ids, Episode(final_answer="917", calls=[ran('{"items": []}')])).total == 0.0  # no such field
    whole = record({"answer_from": {"step": 1}}, ["final_answer"], TIME_STEPS)
    token = ran("  a3f9-77  \n", tool="now")
    assert scored(whole, Episode(final_answer="**A3F9-77**", calls=[token])).total == 1.0
    assert answer_value('{"ok": true}', None, AnswerFrom(step=1, field="ok")) == "true"
    assert answer_value('{"ok": [1]}', None, AnswerFrom(step=1, field="ok")) is None  # no scalar: no answer


def test_answer_from_selects_an_item_and_reads_a_pattern_as_argument_picks_do():
    due = AnswerFrom(step=1, select={"path": "tasks", "key": "title", "value": "Pay rent"}, field="days_overdue")
    listed = '{"tasks": [{"title": "Pay rent", "days_overdue": 3}, {"title": "Call Ana", "days_overdue": 0}]}'
    assert answer_value(listed, None, due) == 3
    assert answer_value('{"tasks": [{"title": "Call Ana", "days_overdue": 0}]}', None, due) is None  # not there
    clock = AnswerFrom(step=1, field="datetime", pattern=r"T(\d\d:\d\d)")
    assert answer_value('{"datetime": "2026-03-01T09:41:07+01:00"}', None, clock) == "09:41"
    # A text result that is no data is read from the structured content the SDK sent beside it.
    assert answer_value("Found 2 tasks", {"count": 2}, AnswerFrom(step=1, field="count")) == 2
    # A Python literal, as servers that print `repr`s write it, is data too.
    assert answer_value("[(1, 'Ana'), (2, 'Ben')]", None, AnswerFrom(step=1, field="1.1")) == "Ben"


def test_checks_leave_volatile_fields_and_patterns_out_of_both_sides():
    listed = {"tasks": [{"id": 1, "title": "Pay rent", "created_at": "2026-03-01T09:41:07"}]}
    rec = record({"checks": [{**check("list", listed), "ignore_fields": ["tasks.*.created_at"]}]}, ["state"])
    later = '{"tasks": [{"id": 1, "title": "Pay rent", "created_at": "2026-03-02T11:00:00"}]}'
    renamed = '{"tasks": [{"id": 1, "title": "Pay the rent", "created_at": "2026-03-01T09:41:07"}]}'
    assert scored(rec, Episode(check_results=[ran(later, tool="list")])).success is True
    assert scored(rec, Episode(check_results=[ran(renamed, tool="list")])).success is False
    text = record({"checks": [{**check("status", "Task 1 done at 09:41:07 (2 left)"),
                                "ignore_patterns": [r"\d\d:\d\d:\d\d"]}]}, ["state"])
    assert scored(text, Episode(check_results=[ran("Task 1 done at 23:02:59 (2 left)", tool="status")])).success
    assert not scored(text, Episode(check_results=[ran("Task 1 done at 23:02:59 (3 left)", tool="status")])).success


def test_volatile_parts_are_left_out_by_path_and_pattern():
    data = {"tasks": [{"id": 1, "at": "x"}, {"id": 2, "at": "y"}], "n": 3}
    assert without_fields(data, ["tasks.*.at"]) == {"tasks": [{"id": 1}, {"id": 2}], "n": 3}
    assert without_fields(data, ["tasks.1", "n"]) == {"tasks": [{"id": 1, "at": "x"}]}
    assert without_fields(data, ["missing.path"]) == data and data["n"] == 3  # the input is not changed
    assert without_patterns(" at 12:30:01 and 13:00:00 ", [r"\d\d:\d\d:\d\d"]) == "at … and …"


# -- records that cannot be scored -------------------------------------------------------------

@pytest.mark.parametrize(("success", "methods", "steps", "message"), [
    ({"answer": 5, "answer_from": {"step": 1}}, ["final_answer"], TIME_STEPS,
     "record: reward_spec.ground_truth.success: give either `answer` or `answer_from`, not both"),
    ({"answer_from": {"step": 3}}, ["final_answer"], TIME_STEPS,
     "record: reward_spec.ground_truth: success.answer_from.step is 3, but tool_sequence has 2 step(s)"),
    ({"answer_from": {"step": 0}}, ["final_answer"], TIME_STEPS,
     "record: reward_spec.ground_truth.success.answer_from.step: Input should be greater than or equal to 1 (got 0)"),
    ({"answer_from": {"step": 1, "field": "a..b"}}, ["final_answer"], TIME_STEPS,
     ("record: reward_spec.ground_truth.success.answer_from.field: got 'a..b'; expected a dotted path like "
     "'items.0.id' (no empty parts)")),
    ({"checks": [{"server": "fs", "tool": "read"}]}, ["state"], [],
     "record: reward_spec.ground_truth.success.checks.0.expect: missing (required)"),
    ({"checks": [check("read", "x", match="like")]}, ["state"], [],
     "record: reward_spec.ground_truth.success.checks.0.match: got 'like'; allowed: equals, contains"),
    ({"checks": [{**check("read", "x"), "server": ""}]}, ["state"], [],
     "record: reward_spec.ground_truth.success.checks.0.server: String should have at least 1 character (got '')"),
    ({}, ["state"], [], "record: reward_spec: method 'state' needs ground_truth.success.state or .checks"),
    ({}, ["final_answer"], [], ("record: reward_spec: method 'final_answer' needs ground_truth.success.answer or "
     ".answer_from")),
])
def test_bad_records_are_named(success, methods, steps, message):
    with pytest.raises(TaskDataError) as caught:
        Task.from_record(record(success, methods, steps), "record")
    assert str(caught.value) == message
