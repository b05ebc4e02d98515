"""Argument values for tools the generator knows nothing about, and what their results hold.

`schema_value` fills one argument from its JSON schema: an `enum`, the `default`, the `examples`,
a `format` (date, date-time, email, uri), a number within `minimum`/`maximum`, a value the state
already holds under the same name (the `pool`, filled from results while exploring), else a fresh
one. `records` lists the objects inside a result's arrays (entities, rows, items) with where
they sit, so a request can name one by a field whose value is unique among them.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from typing import Any

FRESH_NAMES = ("Iris Vega", "Leo Grant", "Mina Soto", "Nils Berg", "Ola Reyes", "Pia Lund", "Ravi Das", "Sara Holm",
               "Theo Marsh", "Uma Patel", "Vera Cruz", "Wes Moreno")
SEARCH_WORDS = {"query", "search", "keyword", "term", "q", "text", "pattern", "phrase"}
"""Words of an argument's name that say it takes words to look for: a word the state holds."""
DATE_WORDS = {"date", "due", "deadline", "day", "birthday"}
"""Words of an argument's name that say it takes a date (a schema may say only "string")."""
FRESH_TEXTS = ("plays the cello", "prefers email", "joined in 2024", "speaks Finnish", "owns a red bicycle",
               "is allergic to nuts", "runs marathons", "collects stamps", "works remotely", "likes jazz")


def words(name: str) -> list[str]:
    """`memberNames` -> ["member", "name"]; `home_path` -> ["home", "path"] (lower case, singular)."""
    parts = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name).replace("_", " ").replace("-", " ").lower().split()
    return [p[:-1] if p.endswith("s") and not p.endswith("ss") and len(p) > 3 else p for p in parts]


def same_kind(arg: str, key: str) -> bool:
    """An argument and a result field name the same thing: `names`/`name`, `memberName`/`name`,
    `from`/`from`: equal last words (all words, where both have several)."""
    a, k = words(arg), words(key)
    if len(a) > 1 and len(k) > 1:  # memberType and linkType name different things
        return a == k
    return bool(a and k) and a[-1] == k[-1]


MAX_DEPTH = 6
"""Nesting of objects and arrays a value is made for (a deeper schema gets no value)."""


def _bound(schema: dict, key: str, default: float) -> float:
    value = schema.get(key, default)
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else default


def schema_value(name: str, schema: dict, rng: random.Random, pool: dict[str, list[Any]], fresh: bool = False,
                 depth: int = 0) -> Any:
    """A value for argument `name` (see the module doc); `fresh` prefers a new value over one the
    state holds (for names a write creates). ValueError when the schema allows no value this can
    make (an empty enum, a type that is only null, nesting past MAX_DEPTH)."""
    schema = schema if isinstance(schema, dict) else {}
    if depth > MAX_DEPTH:
        raise ValueError(f"{name}: nested past {MAX_DEPTH} levels")
    if "enum" in schema:
        choices = [v for v in schema["enum"] if v is not None] if isinstance(schema["enum"], list) else []
        if not choices:
            raise ValueError(f"{name}: its enum offers no value")
        return rng.choice(choices)
    if schema.get("default") is not None:
        return schema["default"]
    if isinstance(schema.get("examples"), list) and schema["examples"]:
        return rng.choice(schema["examples"])
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    options = schema.get("anyOf") or schema.get("oneOf")
    if kind is None and isinstance(options, list):
        option = next((o for o in options if isinstance(o, dict) and o.get("type") != "null"), None)
        if option is None:
            raise ValueError(f"{name}: none of its anyOf/oneOf options takes a value")
        return schema_value(name, option, rng, pool, fresh, depth + 1)
    if kind == "null":
        raise ValueError(f"{name}: its type is only null")
    if kind == "array":
        return [schema_value(name, schema.get("items") or {}, rng, pool, fresh, depth + 1)]
    if kind == "object":
        properties = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        return {key: schema_value(key, prop, rng, pool, fresh and same_kind(key, "name"), depth + 1)
                for key, prop in properties.items()}
    if kind in ("integer", "number"):
        known = [v for key, values in pool.items() if same_kind(name, key) for v in values
                 if isinstance(v, int) and not isinstance(v, bool)]
        low, high = _bound(schema, "minimum", 1), _bound(schema, "maximum", 20)
        low, high = min(low, high), max(low, high)
        known = [v for v in known if low <= v <= high or "minimum" not in schema and "maximum" not in schema]
        if known and not fresh:
            return rng.choice(sorted(set(known)))
        return rng.randint(int(low), int(high)) if kind == "integer" else round(rng.uniform(low, high), 1)
    if kind == "boolean":
        return rng.choice((True, False))
    formats = {"date": "2025-03-14", "date-time": "2025-03-14T09:30:00Z", "email": "ana@example.com",
               "uri": "https://example.com/item/7"}
    if schema.get("format") in formats:
        return formats[schema["format"]]
    if set(words(name)) & DATE_WORDS:
        return f"2025-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    known = [v for key, values in pool.items() if same_kind(name, key) for v in values if isinstance(v, str)]
    if known and not fresh:
        return rng.choice(sorted(set(known)))
    last = words(name)[-1] if words(name) else ""
    if last in SEARCH_WORDS:
        found = sorted({w for values in pool.values() for v in values if isinstance(v, str)
                        for w in re.findall(r"[A-Za-z]{5,}", v)})
        if found:
            return rng.choice(found)
    if last in ("path", "file", "filename") and known:
        return fresh_path(sorted(set(known)), rng)
    if last in ("name", "title", "label", "from", "to"):
        return rng.choice(FRESH_NAMES)
    return rng.choice(FRESH_TEXTS)


def fresh_path(examples: list[str], rng: random.Random) -> str:
    """A new path shaped like the state's own (`notes/2025-01-meeting.md` -> `notes/<new name>.md`)."""
    model = rng.choice(examples)
    folder, _, leaf = model.rpartition("/")
    suffix = "." + leaf.rsplit(".", 1)[1] if "." in leaf else ""
    stem = rng.choice(FRESH_TEXTS).replace(" ", "-")
    return f"{folder}/{stem}{suffix}" if folder else f"{stem}{suffix}"


def records(data: Any, path: str = "") -> Iterator[tuple[str, list[dict]]]:
    """(path of an array, its objects) for every array of objects in `data`."""
    if isinstance(data, list):
        objects = [x for x in data if isinstance(x, dict)]
        if objects and len(objects) == len(data):
            yield path, objects
        for i, item in enumerate(data):
            yield from records(item, f"{path}.{i}" if path else str(i))
    elif isinstance(data, dict):
        for key, value in data.items():
            yield from records(value, f"{path}.{key}" if path else key)


def leaves(data: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted path, value) of every scalar in `data`."""
    if isinstance(data, dict):
        for key, value in data.items():
            yield from leaves(value, f"{path}.{key}" if path else key)
    elif isinstance(data, list):
        for i, value in enumerate(data):
            yield from leaves(value, f"{path}.{i}" if path else str(i))
    elif data is not None:
        yield path, data


def add_to_pool(pool: dict[str, list[Any]], data: Any) -> None:
    """Every short text and every integer of a result under its field name
    (`entities.0.name` -> pool["name"], `tasks.3.id` -> pool["id"])."""
    for path, value in leaves(data):
        key = next((p for p in reversed(path.split(".")) if not p.isdigit()), None)
        wanted = (isinstance(value, str) and 0 < len(value) <= 80) or (isinstance(value, int) and not isinstance(value, bool))
        if key and wanted and value not in pool.setdefault(key, []):
            pool[key].append(value)


def singular(key: str) -> str:
    """`entities` -> `entity`, `relations` -> `relation`, `items` -> `item`."""
    last = key.rsplit(".", 1)[-1]
    if last.endswith("ies"):
        return last[:-3] + "y"
    return last[:-1] if last.endswith("s") and not last.endswith("ss") else (last if not last.isdigit() else "item")
