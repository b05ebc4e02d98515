"""How generated tasks are judged on what an episode left and what its own calls returned.

- End-state checks (`success.checks`, schema `StateCheck`): the environment calls each check's
  read-only tool when the episode ends, on the episode's own state; `check_passes` compares the
  result with `expect`: a string against the result text (both stripped), any other JSON value
  against the result as JSON (`result_json`: the text parsed as JSON, else the structured
  content, unwrapped from the SDK's `{"result": ...}`).
- Answers from the episode's own calls (`success.answer_from`): `expected_answer` is the result of
  the episode's last successful call of the named step's tool, or one field of it.

Task generation records `expect` with `recorded_expect` and reads a gold answer with
`answer_value`, so a check recorded on the gold chain's state passes on the same state.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from environments.process_reward import calls_tool
from environments.tasks.picks import PickError, read_result
from environments.tasks.schema import AnswerFrom, StateCheck, Task

if TYPE_CHECKING:
    from environments.rewards import CallRecord, Episode

MISSING = object()
"""No JSON value: the result is neither JSON text nor structured content."""


def result_json(text: str, structured: dict | None) -> Any:
    """The result as a JSON value: its text parsed as JSON, else its structured content (the
    SDK's `{"result": x}` wrapper of a non-object return unwrapped), else MISSING."""
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        pass
    if isinstance(structured, dict):
        return structured["result"] if list(structured) == ["result"] else structured
    return MISSING


def recorded_expect(text: str, structured: dict | None) -> Any:
    """What a check made on this result should expect: the JSON value when the text is JSON,
    else the stripped text. (`check_passes` with `match: equals` then holds on this result.)"""
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return text.strip()


def json_equal(expected: Any, actual: Any) -> bool:
    """JSON equality: numbers by value (1 == 1.0), but a boolean is no number; lists in order."""
    if isinstance(expected, bool) or isinstance(actual, bool):
        return type(expected) is type(actual) and expected == actual
    if isinstance(expected, (int, float)) and isinstance(actual, (int, float)):
        return expected == actual
    if isinstance(expected, dict) and isinstance(actual, dict):
        return expected.keys() == actual.keys() and all(json_equal(v, actual[k]) for k, v in expected.items())
    if isinstance(expected, list) and isinstance(actual, list):
        return len(expected) == len(actual) and all(json_equal(e, a) for e, a in zip(expected, actual))
    return type(expected) is type(actual) and expected == actual


def json_contains(expected: Any, actual: Any) -> bool:
    """`expected` is part of `actual`: an object's keys with containing values, a list's items
    each in some item, a string inside the string; other values equal."""
    if isinstance(expected, dict):
        return isinstance(actual, dict) and all(k in actual and json_contains(v, actual[k]) for k, v in expected.items())
    if isinstance(expected, list):
        return isinstance(actual, list) and all(any(json_contains(e, a) for a in actual) for e in expected)
    if isinstance(expected, str):
        return isinstance(actual, str) and expected in actual
    return json_equal(expected, actual)


VOLATILE = "…"
"""What a volatile part of a text (an `ignore_patterns` match) reads as when texts are compared."""


def without_fields(value: Any, paths: Sequence[str]) -> Any:
    """`value` with the parts at `paths` (dotted, `*` any key or index) left out; the input is
    not changed."""
    if not paths:
        return value
    def drop(node: Any, parts: list[str]) -> Any:
        head, rest = parts[0], parts[1:]
        if isinstance(node, dict):
            keys = list(node) if head == "*" else [head]
            return {k: (v if k not in keys else drop(v, rest)) for k, v in node.items()
                    if not (k in keys and not rest)}
        if isinstance(node, list):
            picked = range(len(node)) if head == "*" else [int(head)] if head.lstrip("-").isdigit() else []
            chosen = {i % len(node) for i in picked if -len(node) <= i < len(node)} if node else set()
            return [drop(v, rest) if i in chosen and rest else v for i, v in enumerate(node)
                    if not (i in chosen and not rest)]
        return node
    for path in paths:
        value = drop(value, path.split("."))
    return value


def without_patterns(text: str, patterns: Sequence[str]) -> str:
    """`text` stripped, with every match of `patterns` read as one placeholder (VOLATILE)."""
    text = text.strip()
    for pattern in patterns:
        text = re.sub(pattern, VOLATILE, text, flags=re.MULTILINE)
    return text


def check_passes(check: StateCheck, record: CallRecord | None) -> bool:
    """Whether the check's call succeeded and its result matches `check.expect`, with its volatile
    parts (`ignore_fields`, `ignore_patterns`) left out of both."""
    if record is None or record.status != "ok":
        return False
    if isinstance(check.expect, str):
        text = without_patterns(record.result, check.ignore_patterns)
        expected = without_patterns(check.expect, check.ignore_patterns)
        return text == expected if check.match == "equals" else expected in text
    actual = result_json(record.result, record.structured)
    if actual is MISSING:
        return False
    actual = without_fields(actual, check.ignore_fields)
    expected = without_fields(check.expect, check.ignore_fields)
    return json_equal(expected, actual) if check.match == "equals" else json_contains(expected, actual)


def answer_value(text: str, structured: dict | None, source: AnswerFrom) -> str | int | float | None:
    """The answer a call's result gives as `source` reads it (environments/tasks/picks.py
    `read_result`: the stripped text, or one value of its parsed form; booleans as `true` /
    `false`). None when the value is missing or is no scalar."""
    try:
        value = read_result(text, source.select, source.field, source.pattern, structured)
    except PickError:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    return value if isinstance(value, (str, int, float)) else None


def expected_answer(task: Task, episode: Episode) -> str | int | float | None:
    """For `success.answer_from`: what the episode's own last successful call of the step's tool
    answered (None: no such call, or no value at the field)."""
    return answer_from_calls(task, episode.calls)


def answer_from_calls(task: Task, calls: Sequence[CallRecord]) -> str | int | float | None:
    """`expected_answer` of an episode that made `calls`."""
    source = task.reward_spec.ground_truth.success.answer_from
    step = task.reward_spec.ground_truth.tool_sequence[source.step - 1]
    made = [c for c in calls if c.status == "ok" and calls_tool(c, step.tool, step.server)]
    if not made:
        return None
    return answer_value(made[-1].result, made[-1].structured, source)
