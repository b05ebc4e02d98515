"""How the generic family words an act on a thing and what such a request must say: the
values a call sets (every one said, none left for the model to guess), a description's sentence
made specific, and whether a write's result describes the thing or only reports what it did."""

from __future__ import annotations

import re
from typing import Any

from environments.taskgen.families.generic.collections import Collection
from environments.taskgen.wording import plural

BARE_CHANGES = ("update", "set", "edit", "change", "modify")
"""Verbs that say nothing without the values they set."""


def _name_of(path: str) -> str:
    """What a value at a dotted path is called: its last name that is not an index."""
    return next(part for part in reversed(path.split(".")) if not part.isdigit())


def _describes(found: dict, item: dict, c: Collection) -> bool:
    """A result holds the thing itself: it agrees with the listed item on a field other than its
    name and the references it may be asked by."""
    return any(key in item and key not in c.ref_fields and key != c.name_field and item[key] == value
               and value not in ("", None)
               for key, value in found.items())


def _simple(prop: Any) -> bool:
    """An optional argument a request can set in words: an enum, a short text, a date, a number."""
    if not isinstance(prop, dict):
        return False
    options = [prop, *[o for o in (prop.get("anyOf") or prop.get("oneOf") or []) if isinstance(o, dict)]]
    kinds = {o.get("type") for o in options} - {None, "null"}
    return bool(kinds & {"string", "integer", "number"}) and not any(o.get("type") == "object" for o in options)


def _value(value: Any) -> str:
    if isinstance(value, list):
        return ", ".join(_value(v) for v in value)
    return f'"{value}"' if isinstance(value, str) else str(value).lower() if isinstance(value, bool) else str(value)


def _act_sentence(description: str, verb: str, noun: str, thing: str) -> str:
    """The description's first sentence with its thing made specific ("Mark a task as done" ->
    "mark the task "Pay rent" as done"), else "<verb> <thing>."."""
    first = re.split(r"(?<=[.!?])\s", " ".join(description.split()), maxsplit=1)[0].rstrip(".")
    pattern = re.compile(rf"\b(?:a|an|the|one|multiple|some|existing|specific|given|specified|new|\s)*\s*"
                         rf"(?:\w+\s){{0,1}}(?:{re.escape(plural(noun))}|{re.escape(noun)}(?:s|es)?)\b(?:\s+by\s+(?:its\s+)?\w+)?", re.IGNORECASE)
    if first.lower().startswith(verb) and pattern.search(first) and len(first) < 90:
        said = pattern.sub(" " + thing, first, count=1)
        said = re.sub(r"\s+(?:from|in|of)\s+the\s+[\w ]+$", "", said)
        return " ".join(said.split())[0].lower() + " ".join(said.split())[1:] + "."
    return f"{verb} {thing}."
