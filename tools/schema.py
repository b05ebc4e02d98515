"""JSON Schema of tool arguments, written compactly for a model to read.

`type_name(prop)` names a property's type (`string`, `integer|null`, `array[number]`,
`"a"|"b"` for enums, `any` when unconstrained); `signature(name, schema)` is
`name(arg: type, optional?: type)`. System prompts and argument error messages both use them, so a
type reads the same wherever the model meets it.
"""

from __future__ import annotations

import json
from typing import Any


def type_name(prop: Any) -> str:
    if not isinstance(prop, dict):
        return "any"
    if "enum" in prop:
        return "|".join(json.dumps(v) for v in prop["enum"])
    kind = prop.get("type")
    if isinstance(kind, list):
        return "|".join(str(k) for k in kind)
    if kind == "array" and isinstance(prop.get("items"), dict):
        return f"array[{type_name(prop['items'])}]"
    if kind:
        return str(kind)
    options = prop.get("anyOf") or prop.get("oneOf")
    if options:
        return "|".join(type_name(o) for o in options if isinstance(o, dict))
    return "any"


def signature(name: str, schema: dict | None) -> str:
    """`name(arg: type, opt?: type)`: required arguments plain, optional ones with `?`."""
    schema = schema or {}
    required = set(schema.get("required") or [])
    args = ", ".join(f"{arg}{'' if arg in required else '?'}: {type_name(prop)}"
                     for arg, prop in (schema.get("properties") or {}).items())
    return f"{name}({args})"
