"""Reading a tool's input schema as the families need it: its required arguments, its properties,
a property's JSON type (the one that is not null) and the choices it offers. Servers write schemas
carelessly: whatever is not of the expected shape reads as absent."""

from __future__ import annotations

from typing import Any


def required(spec: Any) -> list[str]:
    """The names of a tool's required arguments, in the schema's order."""
    schema = spec.input_schema or {}
    return [r for r in schema.get("required") or [] if isinstance(r, str)]


def properties(spec: Any) -> dict[str, Any]:
    props = (spec.input_schema or {}).get("properties")
    return props if isinstance(props, dict) else {}


def kind(prop: Any) -> str | None:
    """A property's JSON type (the non-null one of a type list or an `anyOf`)."""
    if not isinstance(prop, dict):
        return None
    if isinstance(prop.get("type"), str):
        return prop["type"]
    if isinstance(prop.get("type"), list):
        kinds = [k for k in prop["type"] if k != "null"]
        return kinds[0] if len(kinds) == 1 else None
    kinds = [p.get("type") for p in prop.get("anyOf") or [] if isinstance(p, dict) and p.get("type") != "null"]
    return kinds[0] if len(kinds) == 1 else None


def choices(prop: Any) -> list[Any]:
    """The values a property offers (its `enum`, or an `anyOf` option's), nulls left out."""
    if not isinstance(prop, dict):
        return []
    for option in (prop, *(o for o in prop.get("anyOf") or [] if isinstance(o, dict))):
        if isinstance(option.get("enum"), list):
            return [v for v in option["enum"] if v is not None]
    return []
