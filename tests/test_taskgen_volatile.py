"""What differs between two runs of the same calls (environments/taskgen/volatile.py): JSON leaves
by path, text by the shape of the runs that changed; exact expected patterns and paths."""

from __future__ import annotations

import re

import pytest

from environments.end_state import without_fields, without_patterns
from environments.taskgen.volatile import (
    Unstable,
    differing_fields,
    differing_patterns,
    token_shape,
)

TASKS_NOW = {"tasks": [{"id": 1, "title": "Pay rent", "created_at": "2026-03-01T09:00:00"},
                       {"id": 2, "title": "Call Ana", "created_at": "2026-03-01T13:32:23", "done_at": None}],
             "count": 2}
TASKS_LATER = {"tasks": [{"id": 1, "title": "Pay rent", "created_at": "2026-03-01T09:00:00"},
                         {"id": 2, "title": "Call Ana", "created_at": "2026-03-02T14:34:14", "done_at": "2026-03-02"}],
               "count": 2}


def test_json_leaves_that_differ_are_named_with_list_positions_as_stars():
    assert differing_fields(TASKS_NOW, TASKS_LATER) == ["tasks.*.created_at", "tasks.*.done_at"]
    assert differing_fields(TASKS_NOW, TASKS_NOW) == []
    # What is left compares equal, and still sees a changed title.
    ignore = differing_fields(TASKS_NOW, TASKS_LATER)
    assert without_fields(TASKS_NOW, ignore) == without_fields(TASKS_LATER, ignore)
    renamed = {**TASKS_LATER, "tasks": [{**TASKS_LATER["tasks"][0], "title": "Pay the rent"}, TASKS_LATER["tasks"][1]]}
    assert without_fields(renamed, ignore) != without_fields(TASKS_NOW, ignore)


@pytest.mark.parametrize(("first", "second"), [
    ([1, 2], [1, 2, 3]),                                  # another list length
    ({"a": 1}, {"b": 1}),                                 # other fields
    ({"a": [1]}, {"a": "1"}),                             # another kind of value
])
def test_results_of_another_shape_are_unstable(first, second):
    with pytest.raises(Unstable):
        differing_fields(first, second)


def test_text_runs_that_differ_become_patterns_of_their_shape():
    now = "Task 11 created at 2026-03-01T13:32:23Z by ana (3 open)"
    later = "Task 11 created at 2026-03-02T14:34:14Z by ana (3 open)"
    (pattern,) = differing_patterns(now, later)
    assert pattern == r"(?<=at\ )\d+\-\d+\-[0-9A-Za-z]+:\d+:[0-9A-Za-z]+"
    assert without_patterns(now, [pattern]) == without_patterns(later, [pattern]) == \
        "Task 11 created at … by ana (3 open)"
    assert without_patterns("Task 12 created at 2026-03-01T13:32:23Z by ana (3 open)", [pattern]) != \
        without_patterns(now, [pattern])  # the id is still compared


def test_a_lone_number_or_word_that_differs_is_anchored_on_the_word_before_it():
    assert differing_patterns("Created note 41 (2 notes)", "Created note 97 (2 notes)") == [r"(?<=note\ )\d+"]
    assert differing_patterns("Today is Monday.", "Today is Tuesday.") == [r"(?<=is\ )[A-Za-z]+\."]
    assert differing_patterns("id a3f9-0c", "id 3fa9-c0") == [r"(?<=id\ )[0-9A-Za-z]+\-[0-9A-Za-z]+"]
    assert differing_patterns("same", "same") == []


@pytest.mark.parametrize(("first", "second"), [
    ("Nothing is like the other", "Completely different words all over here"),
    ("Task 11 created", "Task 11 created and then some more words"),   # text only one run has
])
def test_texts_that_differ_in_substance_are_unstable(first, second):
    with pytest.raises(Unstable):
        differing_patterns(first, second)


@pytest.mark.parametrize(("run", "pattern"), [("09:41:07", r"\d+:\d+:\d+"), ("Mon", "[A-Za-z]+"),
                                              ("3f2a", "[0-9A-Za-z]+"), ("12.5s", r"\d+\.[0-9A-Za-z]+")])
def test_token_shapes(run, pattern):
    assert token_shape(run) == pattern and re.fullmatch(pattern, run)
