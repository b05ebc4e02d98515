"""What a server's results hold, as a person would name it: collections of things (the tasks a
list returns, the entities of a graph, the documents a search finds), each with a noun, the field
its things are named by and the field they are referred to by in calls (an id, a name, a path).

Nothing here knows a tool by name: nouns come from where the things sit in a result
(`entities` -> "entity") or from the words of the tool that returned them (a list `order_list`
returns orders); the naming field is the text field whose values are unique and read like names;
a tool's parameter takes a field's values when the two name the same thing (`task_id` and a
task's `id`, `memberNames` and a member's `name`, `path` and a document's `file_path`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from environments.taskgen.observe import Observed
from environments.taskgen.values import records, same_kind
from environments.taskgen.wording import phrase, singular

NAMING = ("name", "title", "label", "subject", "headline", "key", "path", "username", "filename")
"""Last words of fields that name a thing, in the order preferred."""
GENERIC_WORDS = {"list", "get", "all", "search", "find", "show", "read", "query", "fetch", "my", "view", "open",
                 "lookup", "look", "up", "retrieve", "browse", "display", "the", "a", "an", "by", "of", "for",
                 "tool", "info", "details", "detail", "nodes", "data"}
"""Words of a tool's name that say how it reads, not what it returns."""
VERBS = {"create", "add", "new", "insert", "upsert", "save", "register", "record", "put", "store", "write", "make",
         "delete", "remove", "update", "set", "edit", "mark", "complete", "change", "rename", "move", "append"}
"""Words of a tool's name that say what it does to a thing (the thing is the other words)."""
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}([T ][\d:.]+(Z|[+-]\d{2}:?\d{2})?)?$")
_OPAQUE = re.compile(r"^[0-9a-f]{16,}$|^[0-9a-f]{8}-[0-9a-f]{4}-", re.IGNORECASE)


def is_date(value: Any) -> bool:
    return isinstance(value, str) and bool(_DATE.match(value))


def reads_as_name(value: Any) -> bool:
    """A value a person would name a thing by: short text with letters, not a date, not an
    opaque id (hex, a UUID)."""
    return (isinstance(value, str) and 2 <= len(value) <= 80 and any(c.isalpha() for c in value)
            and "\n" not in value and not is_date(value) and not _OPAQUE.match(value))


@dataclass
class Collection:
    """The things one read returned: its items, what to call one, and how to refer to one."""

    read: Observed
    path: str
    """Where the items sit in the parsed result (empty: the result is the list)."""
    items: list[dict[str, Any]]
    noun: str
    name_field: str | None
    ref_fields: list[str] = field(default_factory=list)
    """Fields whose values identify an item (an id, the naming field, a path)."""

    @property
    def named(self) -> list[dict[str, Any]]:
        return [i for i in self.items if reads_as_name(i.get(self.name_field))] if self.name_field else []

    def fields(self, but: tuple[str, ...] = ()) -> list[str]:
        """Scalar fields every item has, that differ between items and that a request can name
        (not a column known only by its position, `#3`), the naming field and `but` left out."""
        keys = [k for k in self.items[0] if k != self.name_field and k not in but and not k.startswith("#")]
        # A field with one value for every thing (a record's kind) tells nothing about any one.
        return [k for k in keys if all(isinstance(i.get(k), (str, int, float)) and not isinstance(i.get(k), bool)
                                       for i in self.items) and len({str(i[k]) for i in self.items}) > 1]


def noun_of_tool(tool: str, description: str = "") -> str:
    """What a tool returns, from its name's words without the words of how it reads (`order_list`
    -> "order", `find_books` -> "book"), else from its description ("List entries (id, ...)" ->
    "entry"), else "item"."""
    words = [w for w in phrase(tool).split() if w not in GENERIC_WORDS and w not in VERBS]
    if words:
        return singular(" ".join(words[-2:]))
    sentence = re.sub(r"[^A-Za-z ]", " ", description.split(".")[0]).lower().split()
    nouns = [w for w in sentence[1:] if w not in GENERIC_WORDS and len(w) > 2]
    return singular(nouns[0]) if nouns else "item"


def _naming_field(items: list[dict]) -> str | None:
    unique = []
    for key in items[0]:
        values = [i.get(key) for i in items]
        if all(reads_as_name(v) for v in values) and len(set(values)) == len(values):
            unique.append(key)
    if not unique:
        return None
    def rank(key: str) -> tuple:
        last = phrase(key).split()[-1] if phrase(key) else key
        named = NAMING.index(last) if last in NAMING else len(NAMING)
        return named, sum(len(str(i[key])) for i in items) / len(items)
    return min(unique, key=rank)


def _ref_fields(items: list[dict], name_field: str | None) -> list[str]:
    refs = [] if name_field is None else [name_field]
    for key in items[0]:
        values = [i.get(key) for i in items]
        unique = len(set(map(str, values))) == len(values)
        if key != name_field and unique and (phrase(key).split() or [""])[-1] in ("id", "key", "path", "uuid", "slug"):
            refs.append(key)
    return refs


def find_collections(reads: list[Observed], descriptions: dict[str, str]) -> list[Collection]:
    """The collections in what the reads returned (arrays of objects with at least two items, or
    one object a read returned whole)."""
    found = []
    for read in reads:
        for path, items in records(read.data):
            items = [i for i in items if isinstance(i, dict) and i]
            if len(items) < 2 or len(set.intersection(*(set(i) for i in items))) < 2:
                continue
            common = set.intersection(*(set(i) for i in items))
            items = [{k: v for k, v in i.items() if k in common} for i in items]  # the fields every item has
            last = next((p for p in reversed(path.split(".")) if p and not p.isdigit()), "")
            noun = singular(phrase(last)) if last else noun_of_tool(read.tool, descriptions.get(read.tool, ""))
            name = _naming_field(items)
            found.append(Collection(read, path, items, noun, name, _ref_fields(items, name)))
    return found


def feeds(param: str, prop: dict, item_field: str, value: Any) -> bool:
    """A tool's parameter takes values of an item's field: they name the same thing and the types fit."""
    if not same_kind(param, item_field):
        return False
    kind = prop.get("type") if isinstance(prop, dict) else None
    options = [o.get("type") for o in (prop.get("anyOf") or prop.get("oneOf") or []) if isinstance(o, dict)]
    kinds = {kind, *options} - {None, "null"}
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return bool(kinds & {"integer", "number"}) or not kinds
    if isinstance(value, str):
        items = prop.get("items") if isinstance(prop.get("items"), dict) else {}
        return bool(kinds & {"string"}) or ("array" in kinds and items.get("type") == "string") or not kinds
    return False
