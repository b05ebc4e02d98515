"""Arguments taken from an episode's own earlier results (`ToolStep.picks`, schema `Picked`).

A later call of a task often needs a value an earlier call returned: the hash of the commit the
log shows, the id a look-up found, the hours and minutes a clock read. A record says how to take
it: step N's result, parsed (`parse_result`: JSON, else a Python literal as some servers print
them), optionally one item of a list chosen by a key (`select`), a dotted `field`, a regular
expression (`pattern`), and a `format` that builds the argument around the value. Without
`select` and `field` the value is the result's text.

One function does it everywhere (`pick_value`): when a task is generated (the chain is run on the
real servers), when a warm-start gold trajectory plays it (the gold call uses what *this*
episode's earlier calls returned, never the values recorded at generation time: a clock has moved
on, a commit made in the episode has its own hash), and when the process reward checks a model's
call against what the model's own earlier calls returned.
"""

from __future__ import annotations

import ast
import copy
import json
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import Field, field_validator, model_validator

from environments.tasks.success import Selection, Strict
from environments.tasks.text_records import text_records
from environments.tasks.truncated import complete_part, python_values

PLACEHOLDER = "{}"
"""Where a `format` puts the picked value."""


class PickError(ValueError):
    """The value is not in the result (the message says which part of the pick found nothing)."""


class Picked(Strict):
    """How one argument follows from an earlier step's result (see the module doc)."""

    step: int = Field(ge=1)
    """The step (1-based) whose result holds the value: in an episode, the last successful call
    of that step's tool before this call."""
    select: Selection | None = None
    """Choose one item of a list in the parsed result first."""
    field: str | None = None
    """Dotted path into the parsed result (or the selected item); digits index lists."""
    pattern: str | None = None
    """A regular expression searched (multi-line) in the value so far as text: its first group,
    or the whole match, is the value; every match must give the same value."""
    format: str | None = None
    """The argument as text around the value, which replaces each `{}`; null: the value itself
    (a number stays a number)."""
    number: bool = False
    """The value is a number where the argument takes one (`"3.5"` -> 3.5, `"12"` -> 12): some
    servers write numbers as text in their results. Not together with `format`."""

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, pattern: str | None) -> str | None:
        if pattern is not None:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"{pattern!r} is no regular expression: {exc}") from None
        return pattern

    @field_validator("format")
    @classmethod
    def _has_placeholder(cls, fmt: str | None) -> str | None:
        if fmt is not None and PLACEHOLDER not in fmt:
            raise ValueError(f"{fmt!r} has no {PLACEHOLDER} where the picked value goes")
        return fmt

    @model_validator(mode="after")
    def _number_or_format(self) -> Picked:
        if self.number and self.format is not None:
            raise ValueError("give `number` or `format`, not both")
        return self


def parse_result(text: str) -> Any:
    """A result text as data: JSON, else a Python literal (servers that print `repr`s; tuples
    read as lists, dates and decimals as their values: environments/tasks/truncated.py), else the
    whole items of a JSON result the tool manager cut short, else the records a table or
    `Key: value` lines lay out (environments/tasks/text_records.py), else the stripped text."""
    text = text.strip()
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        pass
    try:
        return _json_like(ast.literal_eval(python_values(text)))
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        pass
    part = complete_part(text)
    if part is not None:
        return part
    records = text_records(text)
    return text if records is None else records


def _json_like(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [_json_like(v) for v in value]
    if isinstance(value, dict):
        return {k: _json_like(v) for k, v in value.items()}
    return value


def dig(data: Any, path: str | None) -> Any:
    """The value at a dotted path (`target.datetime`, `0.name`, `entities.2.name`); digits index
    lists, and the fields of an object in their order where it has no such key (`0.0`: the first
    value of a result's first row, whether the server writes rows as objects or as tuples);
    PickError naming the part where it stopped."""
    if not path:
        return data
    for part in path.split("."):
        if isinstance(data, list) and part.lstrip("-").isdigit() and -len(data) <= int(part) < len(data):
            data = data[int(part)]
        elif isinstance(data, dict) and part in data:
            data = data[part]
        elif isinstance(data, dict) and part.isdigit() and int(part) < len(data):
            data = list(data.values())[int(part)]
        else:
            raise PickError(f"the result has no {path!r} (stopped at {part!r})")
    return data


def _selected(data: Any, select: Selection) -> Any:
    items = dig(data, select.path)
    if not isinstance(items, list):
        raise PickError(f"{select.path or 'the result'} is no list")
    matches = [item for item in items if isinstance(item, dict) and item.get(select.key) == select.value]
    if len(matches) != 1:
        raise PickError(f"{len(matches)} items of {select.path or 'the result'} have {select.key} = "
                        f"{json.dumps(select.value)}, not one")
    return matches[0]


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def read_result(text: str, select: Selection | None = None, field: str | None = None, pattern: str | None = None,
                structured: Any = None) -> Any:
    """A value from a result: the whole stripped text, or (with `select` or `field`) from its
    parsed form (`parse_result`; the structured content where the text is no data), then a
    regular expression over it as text. PickError when it is not there."""
    if select is None and field is None:
        value: Any = text.strip()
    else:
        value = parse_result(text)
        if isinstance(value, str) and isinstance(structured, dict):
            # The SDK wraps a non-object return as {"result": ...}.
            value = structured["result"] if list(structured) == ["result"] else structured
        if select is not None:
            value = _selected(value, select)
        value = dig(value, field)
    if pattern is not None:
        found = {m.group(1) if m.re.groups else m.group(0)
                 for m in re.finditer(pattern, _as_text(value), re.MULTILINE)}
        if len(found) != 1:
            raise PickError(f"the pattern {pattern!r} gives {len(found)} different values, not one")
        value = found.pop()
    return value


def pick_value(picked: Picked, text: str) -> Any:
    """The argument `picked` takes from a result `text` (PickError when it is not there)."""
    value = read_result(text, picked.select, picked.field, picked.pattern)
    if picked.number:
        return _number(value)
    return picked.format.replace(PLACEHOLDER, _as_text(value)) if picked.format is not None else value


def _number(value: Any) -> int | float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    try:
        number = float(str(value).strip())
    except ValueError:
        raise PickError(f"{str(value)[:40]!r} is no number") from None
    if not math.isfinite(number):
        raise PickError(f"{str(value)[:40]!r} is no finite number")
    return int(number) if number.is_integer() and "." not in str(value) and "e" not in str(value).lower() else number


def put(args: Any, dotted: str, value: Any) -> None:
    """Set the argument at a dotted path (`content`, `edits.0.newText`, `files.0`)."""
    *parents, last = dotted.split(".")
    target = args
    for part in parents:
        target = target[int(part)] if isinstance(target, list) else target[part]
    if isinstance(target, list):
        target[int(last)] = value
    else:
        target[last] = value


def picked_arguments(params: Mapping[str, Any], picks: Mapping[str, Picked],
                     result_of: Callable[[int], str | None]) -> dict[str, Any]:
    """`params` with every picked argument taken from `result_of(step)` (a step's result text in
    this episode; None when it has none). PickError when a result is missing or lacks the value."""
    args = copy.deepcopy(dict(params))
    for name, picked in picks.items():
        text = result_of(picked.step)
        if text is None:
            raise PickError(f"{name} comes from step {picked.step}, which has no result yet")
        try:
            put(args, name, pick_value(picked, text))
        except (KeyError, IndexError, TypeError) as exc:
            raise PickError(f"the arguments have no place {name!r} for the picked value ({exc!r})") from None
    return args
