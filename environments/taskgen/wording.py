"""Words for requests: what a person calls a table, a field or a thing, from the identifiers and
descriptions a server gives (`order_items` -> "order items", `dueDate` -> "due date").

Requests say what the user wants in words, never the identifiers of the tools and parameters
that answer them: `is_identifier` says what counts as one (a name holding `_`, `-`, a digit or an
inner capital), and `names_identifier` finds any of a server's identifiers in a request.

A template says one intent in several ways: `say(rng, options)` picks one, and while
`recording()` is open each pick is noted (which of how many), so the generator can hold a
wording out of training and test on it (the `phrasing` split).
"""

from __future__ import annotations

import contextlib
import random
import re
from collections.abc import Iterable, Iterator, Sequence
from contextvars import ContextVar
from typing import TypeVar

T = TypeVar("T")
_SAID: ContextVar[list[tuple[int, int]] | None] = ContextVar("said", default=None)

_IRREGULAR = {"people": "person", "children": "child", "men": "man", "women": "woman", "data": "data",
              "series": "series", "species": "species", "news": "news", "status": "status", "address": "address"}
_IDENTIFIER = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:[_-][A-Za-z0-9]+)+|[a-z]+[A-Z][A-Za-z0-9]*|[A-Za-z]+\d+[A-Za-z0-9]*")


def phrase(identifier: str) -> str:
    """An identifier in words, lower case: `order_items` -> "order items", `memberType` ->
    "member type", `due-date` -> "due date", `HTTPCode` -> "http code"."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", identifier)
    spaced = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1 \2", spaced)
    return " ".join(spaced.replace("_", " ").replace("-", " ").replace(".", " ").lower().split())


def singular(noun: str) -> str:
    """The singular of a noun phrase's last word: "order items" -> "order item", "categories" ->
    "category", "boxes" -> "box", "people" -> "person"."""
    head, _, last = noun.rpartition(" ")
    lower = last.lower()
    if lower in _IRREGULAR:
        one = _IRREGULAR[lower]
    elif lower.endswith("ies") and len(lower) > 4:
        one = last[:-3] + "y"
    elif lower.endswith(("ches", "shes", "xes", "sses", "zes")):
        one = last[:-2]
    elif lower.endswith("s") and not lower.endswith(("ss", "us", "is")) and len(lower) > 3:
        one = last[:-1]
    else:
        one = last
    return f"{head} {one}".strip()


def plural(noun: str) -> str:
    """The plural of a noun phrase's last word ("order item" -> "order items", "entry" -> "entries")."""
    head, _, last = noun.rpartition(" ")
    lower = last.lower()
    reverse = {v: k for k, v in _IRREGULAR.items() if k != v}
    if lower in reverse:
        many = reverse[lower]
    elif lower.endswith("y") and lower[-2:-1] not in "aeiou":
        many = last[:-1] + "ies"
    elif lower.endswith(("ch", "sh", "x", "ss", "z")):
        many = last + "es"
    elif lower.endswith("s"):
        many = last
    else:
        many = last + "s"
    return f"{head} {many}".strip()


def article(noun: str) -> str:
    return "an" if noun[:1].lower() in "aeiou" else "a"


def quoted(value: object) -> str:
    """A value as a request writes it: text in double quotes, numbers as they are."""
    return f'"{value}"' if isinstance(value, str) else str(value)


def is_identifier(word: str) -> bool:
    """A tool's or parameter's name as code writes it: `_`, `-`, a digit or an inner capital."""
    return bool(_IDENTIFIER.fullmatch(word))


def names_identifier(request: str, identifiers: Iterable[str]) -> str | None:
    """The first of `identifiers` (the names of a server's tools and parameters) that reads as an
    identifier and appears in `request` as a word of its own, or None (a set lookup per word of
    the request: a server's thousands of tools cost no more than a few)."""
    said = set(re.findall(r"[A-Za-z0-9][A-Za-z0-9_-]*[A-Za-z0-9]|[A-Za-z0-9]", request))
    for name in identifiers:
        if name in said and is_identifier(name):
            return name
    return None


def say(rng: random.Random, options: Sequence[T]) -> T:
    """One of a template's ways of saying its request (the same draw as `rng.choice`), noted
    where `recording()` is open."""
    index = rng.randrange(len(options))
    said = _SAID.get()
    if said is not None:
        said.append((index, len(options)))
    return options[index]


@contextlib.contextmanager
def recording() -> Iterator[list[tuple[int, int]]]:
    """The picks `say` makes inside the block, in order: (which, of how many)."""
    said: list[tuple[int, int]] = []
    token = _SAID.set(said)
    try:
        yield said
    finally:
        _SAID.reset(token)


def phrasing_of(said: Sequence[tuple[int, int]]) -> str | None:
    """A draw's wording as the record keeps it: "1/3" (the second of three), "0/2.2/3" for two
    picks; None when the template offered one wording only."""
    if not said or all(of == 1 for _, of in said):
        return None
    return ".".join(f"{which}/{of}" for which, of in said)
