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
FRESH_TEXTS = ("plays the cello", "prefers email", "joined in 2024", "speaks Finnish", "owns a red bicycle",
               "is allergic to nuts", "runs marathons", "collects stamps", "works remotely", "likes jazz")


def words(name: str) -> list[str]:
    """`entityNames` -> ["entity", "name"]; `repo_path` -> ["repo", "path"] (lower case, singular)."""
    parts = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name).replace("_", " ").replace("-", " ").lower().split()
    return [p[:-1] if p.endswith("s") and not p.endswith("ss") and len(p) > 3 else p for p in parts]


def same_kind(arg: str, key: str) -> bool:
    """An argument and a result field name the same thing: `names`/`name`, `entityName`/`name`,
    `from`/`from`: equal last words (all words, where both have several)."""
    a, k = words(arg), words(key)
    if len(a) > 1 and len(k) > 1:  # entityType and relationType name different things
        return a == k
    return bool(a and k) and a[-1] == k[-1]


def schema_value(name: str, schema: dict, rng: random.Random, pool: dict[str, list[Any]], fresh: bool = False) -> Any:
    """A value for argument `name` (see the module doc); `fresh` prefers a new value over one the
    state holds (for names a write creates)."""
    schema = schema if isinstance(schema, dict) else {}
    if schema.get("enum"):
        return rng.choice(schema["enum"])
    if schema.get("default") is not None:
        return schema["default"]
    if schema.get("examples"):
        return rng.choice(schema["examples"])
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), None)
    if kind is None and (schema.get("anyOf") or schema.get("oneOf")):
        option = next(o for o in schema.get("anyOf") or schema.get("oneOf") if o.get("type") != "null")
        return schema_value(name, option, rng, pool, fresh)
    if kind == "array":
        return [schema_value(name, schema.get("items") or {}, rng, pool, fresh)]
    if kind == "object":
        properties = schema.get("properties") or {}
        return {key: schema_value(key, prop, rng, pool, fresh and same_kind(key, "name"))
                for key, prop in properties.items()}
    if kind in ("integer", "number"):
        low, high = schema.get("minimum", 1), schema.get("maximum", 20)
        return rng.randint(int(low), int(high)) if kind == "integer" else round(rng.uniform(low, high), 1)
    if kind == "boolean":
        return rng.choice((True, False))
    formats = {"date": "2025-03-14", "date-time": "2025-03-14T09:30:00Z", "email": "ana@example.com",
               "uri": "https://example.com/item/7"}
    if schema.get("format") in formats:
        return formats[schema["format"]]
    known = [v for key, values in pool.items() if same_kind(name, key) for v in values if isinstance(v, str)]
    if known and not fresh:
        return rng.choice(sorted(set(known)))
    if words(name) and words(name)[-1] in ("name", "title", "label", "from", "to"):
        return rng.choice(FRESH_NAMES)
    return rng.choice(FRESH_TEXTS)


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
    """Every scalar of a result under its field name (`entities.0.name` -> pool["name"])."""
    for path, value in leaves(data):
        key = next((p for p in reversed(path.split(".")) if not p.isdigit()), None)
        if key is not None and isinstance(value, str) and 0 < len(value) <= 80 and value not in pool.setdefault(key, []):
            pool[key].append(value)


def singular(key: str) -> str:
    """`entities` -> `entity`, `relations` -> `relation`, `items` -> `item`."""
    last = key.rsplit(".", 1)[-1]
    if last.endswith("ies"):
        return last[:-3] + "y"
    return last[:-1] if last.endswith("s") and not last.endswith("ss") else (last if not last.isdigit() else "item")
