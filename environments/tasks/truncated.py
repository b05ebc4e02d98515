"""Results as the model sees them, where they are not plain JSON: a long result the tool manager
cut at `tools.max_output_chars` (its JSON ends mid-way, then `…[truncated N chars]`), and Python
reprs holding dates and decimals (`datetime.date(...)`, `Decimal('2.50')`), as servers
that print their database's rows write them.

`complete_part` keeps the items of a cut JSON that arrived whole, so a later call can still pick
a value the model could read; `python_values` rewrites dates and decimals as the literals they
stand for. Both serve `parse_result` (environments/tasks/picks.py), so generation, gold
trajectories and rewards read a result the same way.
"""

from __future__ import annotations

import json
import re
from typing import Any

CUT = re.compile(r"…\[truncated \d+ chars\]\s*(?:\n.*)?$", re.DOTALL)
"""The marker the tool manager ends a cut result with (tools/results.py)."""
MAX_TRIES = 64
"""Cut points tried from the end (each a json.loads of the prefix)."""
_CLOSE = {"{": "}", "[": "]"}


def complete_part(text: str) -> Any:
    """The JSON value made of the items of a cut result that arrived whole (the last, partial item
    and whatever followed it left out, open brackets closed); None when `text` is not a cut JSON
    result or nothing whole is left."""
    match = CUT.search(text)
    if match is None:
        return None
    body = text[:match.start()]
    if not body.lstrip()[:1] in ("{", "["):
        return None
    cuts: list[tuple[int, str]] = []
    stack: list[str] = []
    in_string = escaped = False
    for index, char in enumerate(body):
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in _CLOSE:
            stack.append(_CLOSE[char])
        elif char in "}]" and stack:
            stack.pop()
        elif char == "," and stack and stack[-1] == "]":  # between whole items of a list
            cuts.append((index, "".join(reversed(stack))))
    for index, closing in reversed(cuts[-MAX_TRIES:]):
        try:
            return json.loads(body[:index] + closing)
        except ValueError:
            continue
    return None


_DATE = re.compile(r"datetime\.date\((\d{1,4}), (\d{1,2}), (\d{1,2})\)")
_DATETIME = re.compile(r"datetime\.datetime\((\d{1,4}), (\d{1,2}), (\d{1,2})(?:, (\d{1,2}))?(?:, (\d{1,2}))?"
                       r"(?:, (\d{1,2}))?(?:, (\d{1,6}))?\)")
_DECIMAL = re.compile(r"Decimal\('(-?[\d.]+(?:E[-+]?\d+)?)'\)")


def python_values(text: str) -> str:
    """`text` with Python reprs of dates, date-times and decimals written as the literals they stand
    for (a `datetime.date(...)` as its ISO text, `Decimal('2.50')` -> `2.50`)."""
    if "datetime." not in text and "Decimal(" not in text:
        return text
    text = _DATE.sub(lambda m: f"'{int(m[1]):04d}-{int(m[2]):02d}-{int(m[3]):02d}'", text)

    def when(m: re.Match) -> str:
        h, mi, s, us = (int(x) if x else 0 for x in m.groups()[3:])
        stamp = f"{int(m[1]):04d}-{int(m[2]):02d}-{int(m[3]):02d}T{h:02d}:{mi:02d}:{s:02d}"
        return f"'{stamp}.{us:06d}'" if us else f"'{stamp}'"
    text = _DATETIME.sub(when, text)
    return _DECIMAL.sub(lambda m: m[1], text)
