"""What differs between two runs of the same calls on the same initial state: the volatile parts
of a result (timestamps, generated ids, durations, counts of days).

Task verification runs every chain twice on fresh copies, the second time with the servers'
clock a day and more ahead (environments/taskgen/verify.py). A check's result that differs
between the runs keeps its stable parts only: for JSON, the differing leaves become
`ignore_fields` (dotted paths, list positions written `*`, so a new item's `created_at` is left
out wherever the item lands); for text, each differing stretch becomes an `ignore_patterns`
regular expression of its shape (`\\d{2}:\\d{2}:\\d{2}` for a clock time). Both are read back by
environments/end_state.py when the episode's end state is checked.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator
from typing import Any

_TOKEN = re.compile(r"\w+|[^\w\s]")


class Unstable(ValueError):
    """Two results differ in their shape (a list of another length, another kind of value), not in
    a few values: nothing stable is left to compare."""


def _leaves(value: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _leaves(item, (*path, str(key)))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _leaves(item, (*path, str(index)))
    else:
        yield path, value


def _shape(value: Any) -> Any:
    """The structure of a JSON value: keys and list lengths, leaves as their kind."""
    if isinstance(value, dict):
        return {key: _shape(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_shape(item) for item in value]
    return "number" if isinstance(value, (int, float)) and not isinstance(value, bool) else type(value).__name__


def differing_fields(first: Any, second: Any) -> list[str]:
    """The dotted paths (list positions as `*`) whose values differ between two JSON results of one
    shape; Unstable when their shapes differ (a null and a string count as one shape: a field set
    in one run and not yet in the other)."""
    a, b = dict(_leaves(first)), dict(_leaves(second))
    if a.keys() != b.keys():
        raise Unstable("the two results hold different fields or list lengths")
    paths = set()
    for path, value in a.items():
        other = b[path]
        if value == other and type(value) is type(other):
            continue
        if None not in (value, other) and _shape(value) != _shape(other):
            raise Unstable(f"{'.'.join(path) or 'the result'} is a {_shape(value)} once and a {_shape(other)} once")
        paths.add(".".join("*" if part.isdigit() else part for part in path))
    return sorted(paths)


def token_shape(run: str) -> str:
    """A regular expression for runs shaped like `run`: digits, letters and runs mixing both as
    classes, anything else as itself (`09:41:07` -> `\\d+:\\d+:\\d+`)."""
    parts = []
    for piece in re.finditer(r"[0-9A-Za-z]+|.", run, re.DOTALL):
        text = piece.group()
        if text.isdigit():
            parts.append(r"\d+")
        elif text.isalpha() and text.isascii():
            parts.append(r"[A-Za-z]+")
        elif text.isalnum() and text.isascii():
            parts.append(r"[0-9A-Za-z]+")  # hexadecimal ids mix the two in any order
        else:
            parts.append(re.escape(text))
    return "".join(parts)


def differing_patterns(first: str, second: str) -> list[str]:
    """Patterns for the runs (between spaces) of two texts that differ, each as `token_shape`
    writes it, anchored on the word before it (`(?<=task )\\d+`) so that other runs of that
    shape stay compared. [] when the texts are equal;
    Unstable when most of the text differs, or the two texts do not read the same once the
    patterns are left out."""
    if first == second:
        return []
    a, b = list(_TOKEN.finditer(first)), list(_TOKEN.finditer(second))
    matcher = difflib.SequenceMatcher(a=[m.group() for m in a], b=[m.group() for m in b], autojunk=False)
    if matcher.ratio() < 0.5:
        raise Unstable("the two results differ in most of their text")
    patterns: list[str] = []
    for op, i1, i2, _j1, _j2 in matcher.get_opcodes():
        if op == "equal":
            continue
        if i1 == i2:
            raise Unstable("one run's result has text the other's lacks")
        start, end = _run(first, a[i1].start(), a[i2 - 1].end())
        pattern = token_shape(first[start:end])
        head = first[:start]
        word = head.rstrip().rsplit(None, 1)[-1] if head.strip() else ""
        if word:  # the word before it anchors the pattern: other runs of that shape stay compared
            pattern = f"(?<={re.escape(head[len(head.rstrip()) - len(word):])})" + pattern
        if pattern not in patterns:
            patterns.append(pattern)
    if _masked(first, patterns) != _masked(second, patterns):
        raise Unstable("the two results still differ once their changing parts are left out")
    return patterns


def _run(text: str, start: int, end: int) -> tuple[int, int]:
    """The span [start, end) widened to whole runs of non-space characters."""
    while start > 0 and not text[start - 1].isspace():
        start -= 1
    while end < len(text) and not text[end].isspace():
        end += 1
    return start, end


def _masked(text: str, patterns: list[str]) -> str:
    for pattern in patterns:
        text = re.sub(pattern, "…", text)
    return text
