"""Rewards of generated tasks: end-state checks (`success.checks`) and answers taken from the
episode's own calls (`success.answer_from`), on hand-made records with exact expected rewards;
and the errors of records that cannot be scored."""

from __future__ import annotations

import pytest

from environments.end_state import answer_value, recorded_expect
from environments.rewards import CallRecord, Episode, score
from environments.tasks.schema import Task, TaskDataError


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
    assert answer_value('{"ok": true}', None, "ok") == "true"
    assert answer_value('{"ok": [1]}', None, "ok") is None  # no scalar: no answer


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
