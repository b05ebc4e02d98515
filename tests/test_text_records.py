"""Text results read as records (environments/tasks/text_records.py): tables and `Key: value`
lines become data a pick can select from; anything uncertain stays text."""

from __future__ import annotations

import pytest

from environments.tasks.picks import Picked, Selection, parse_result, pick_value
from environments.tasks.text_records import cell_value, text_records
from environments.tasks.truncated import complete_part, python_values

GIT_LOG = """Commit log:
Commit: 1f2e3d
Author: Ana Lima <ana@example.com>
Date: 2024-03-01 10:00:00
Message: Plant the tomatoes

Commit: 9a8b7c
Author: Ben Ortiz <ben@example.com>
Date: 2024-02-27 09:30:00
Message: Add the shed key note"""


def test_key_value_blocks_are_one_record_each_after_a_title_line():
    assert text_records(GIT_LOG) == [
        {"Commit": "1f2e3d", "Author": "Ana Lima <ana@example.com>", "Date": "2024-03-01 10:00:00",
         "Message": "Plant the tomatoes"},
        {"Commit": "9a8b7c", "Author": "Ben Ortiz <ben@example.com>", "Date": "2024-02-27 09:30:00",
         "Message": "Add the shed key note"}]
    pick = Picked(step=1, select=Selection(key="Message", value="Add the shed key note"), field="Commit")
    assert pick_value(pick, GIT_LOG) == "9a8b7c"


def test_one_block_is_one_object_and_a_line_without_a_key_continues_the_value():
    assert text_records("ID: 7\nTitle: Buy milk\nNotes: the 2% kind,\n  two bottles\nDone: false") == {
        "ID": 7, "Title": "Buy milk", "Notes": "the 2% kind,\ntwo bottles", "Done": False}


def test_records_one_per_line_with_bars():
    text = "Found 2 tasks:\nID: 3 | Title: Buy milk | Due: 2025-03-14\nID: 4 | Title: Call mom | Due: null"
    assert text_records(text) == [{"ID": 3, "Title": "Buy milk", "Due": "2025-03-14"},
                                  {"ID": 4, "Title": "Call mom", "Due": None}]
    assert text_records("ID: 3 | Title: Buy milk") == {"ID": 3, "Title": "Buy milk"}


def test_markdown_and_box_tables_with_their_type_rows_left_out():
    markdown = "Rows:\n| id | name | price |\n|---:|:-----|------|\n| 1 | Ana | 2.5 |\n| 2 | Ben | 007 |"
    assert text_records(markdown) == [{"id": 1, "name": "Ana", "price": 2.5}, {"id": 2, "name": "Ben", "price": "007"}]
    box = ("┌───────┬─────────┐\n│  id   │  name   │\n│ int32 │ varchar │\n├───────┼─────────┤\n"
           "│     1 │ Ana     │\n│     2 │ Ben Ng  │\n└───────┴─────────┘")
    assert text_records(box) == [{"id": 1, "name": "Ana"}, {"id": 2, "name": "Ben Ng"}]
    assert parse_result(box)[1]["name"] == "Ben Ng"


@pytest.mark.parametrize("text", [
    "Result: 42",                                                     # one field is a sentence, not a record
    "Error: the task 9 does not exist",
    "On branch main\nChanges not staged for commit:\n  modified: plots.txt",
    "Note: this is a long sentence with a colon: in it\nand another line",
    "| a | a |\n|---|---|\n| 1 | 2 |",                                # a header naming one column twice
    "| a | b |\n|---|---|\n| 1 |",                                     # a row short of a cell
    "ID: 3 | Title: x\nsomething else entirely\nID: 4 | Title: y",
])
def test_what_is_not_certainly_records_stays_text(text):
    assert text_records(text) is None
    assert parse_result(text) == text.strip()


@pytest.mark.parametrize(("cell", "value"), [("42", 42), ("-3", -3), ("0", 0), ("2.5", 2.5), ("007", "007"),
                                             ("1e3", "1e3"), ("2.50", "2.50"), ("true", True), ("null", None),
                                             (" Ana ", "Ana"), ("+4", "+4")])
def test_cells_are_numbers_only_where_they_read_back_the_same(cell, value):
    assert cell_value(cell) == value and type(cell_value(cell)) is type(value)


def test_a_cut_json_result_keeps_the_items_that_arrived_whole():
    cut = '{"entities": [{"name": "A", "x": [1, 2]}, {"name": "B"}, {"name": "C", "obs": ["lo…[truncated 1234 chars]'
    assert parse_result(cut) == {"entities": [{"name": "A", "x": [1, 2]}, {"name": "B"}]}
    assert parse_result("[1, 2, 3…[truncated 9 chars]") == [1, 2]
    assert parse_result("not json…[truncated 9 chars]") == "not json…[truncated 9 chars]"
    assert complete_part('{"a": 1}') is None  # nothing was cut


def test_python_reprs_of_dates_and_decimals_read_as_their_values():
    rows = "[(1, 'Ana', datetime.date(2024, 3, 1), Decimal('2.50'), datetime.datetime(2024, 3, 1, 9, 5))]"
    assert parse_result(rows) == [[1, "Ana", "2024-03-01", 2.5, "2024-03-01T09:05:00"]]
    assert python_values("no reprs here") == "no reprs here"
