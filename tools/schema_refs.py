"""The `$ref`s of a tool's JSON schema, resolved inside the schema and nowhere else.

A server's schema may point anywhere: `https://` on a host that never answers, `file:///dev/zero`,
itself. jsonschema's default registry fetches what a `$ref` names at validation time, inside the
event loop, without a timeout; a loop recurses until Python gives up. Here every reference resolves
in the schema itself (`#/...` pointers, `$defs` / `definitions`, `$id`s and anchors declared
inside it, and the JSON-schema meta-schemas jsonschema ships) or is refused: `local_registry`
is a registry whose retrieval refuses every address, and `schema_problem` walks the schema once,
before any call, to name what cannot be used.

What the walk refuses: a reference that does not resolve locally; a loop of references (or of
in-place applicators: `allOf`, `anyOf`, `oneOf`, `not`, `if`/`then`/`else`, `dependentSchemas`)
that never descends into the arguments, which would recurse forever on any value; a chain of more
than MAX_IN_PLACE_CHAIN such hops in a row; a schema nested deeper than MAX_SCHEMA_DEPTH. A
reference that descends into the arguments (`properties`, `items`, ...) may recur: the arguments'
own depth bounds it (tools/arguments.py refuses arguments nested deeper than 100 levels).
"""

from __future__ import annotations

from typing import Any

import referencing.jsonschema
from jsonschema_specifications import REGISTRY as META_SCHEMAS
from referencing import Registry, Resource
from referencing.exceptions import NoSuchResource, Unresolvable

MAX_SCHEMA_DEPTH = 64
"""Deepest nesting of objects and arrays in a tool's schema (real schemas stay under 20)."""
MAX_IN_PLACE_CHAIN = 32
"""Most `$ref` / `allOf`-like hops in a row that apply to one value (real schemas use a few)."""

_REF_KEYWORDS = ("$ref", "$dynamicRef", "$recursiveRef")
# Subschemas applied to the same value as their parent: a cycle through these never ends.
_IN_PLACE_ONE = ("not", "if", "then", "else")
_IN_PLACE_LIST = ("allOf", "anyOf", "oneOf")
_IN_PLACE_MAP = ("dependentSchemas", "dependencies")
# Subschemas applied to a part of the value (a property, an item, a key): a cycle through one of
# these ends where the arguments end.
_DESCENDING_ONE = ("additionalProperties", "unevaluatedProperties", "propertyNames", "contains",
                   "additionalItems", "unevaluatedItems", "items")
_DESCENDING_LIST = ("prefixItems", "items")
_DESCENDING_MAP = ("properties", "patternProperties")


def _refuse_retrieval(uri: str) -> Resource:
    raise NoSuchResource(ref=uri)


def local_registry(schema: dict) -> Registry:
    """A registry holding `schema` (with every `$id` inside it) that never retrieves anything."""
    resource = _specification(schema).create_resource(schema)
    return Registry(retrieve=_refuse_retrieval).with_resource(resource.id() or "", resource).crawl()


def schema_problem(schema: Any) -> str | None:
    """Why `schema` cannot be used to check arguments without fetching or recursing forever
    (see the module docstring); None when it can."""
    if _nesting(schema) > MAX_SCHEMA_DEPTH:
        return f"the schema is nested deeper than {MAX_SCHEMA_DEPTH} levels"
    if not isinstance(schema, dict):
        return None
    try:
        specification = _specification(schema)
        registry = META_SCHEMAS.combine(local_registry(schema))
        resolver = registry.resolver_with_root(specification.create_resource(schema))
    except Exception as exc:  # noqa: BLE001 - an `$id` that referencing cannot take
        return f"the schema's ids cannot be read: {type(exc).__name__}: {exc}"
    try:
        _Walk(specification).run(schema, resolver)
    except _Refused as refused:
        return str(refused)
    return None


def _specification(schema: dict):
    """The dialect `$schema` names, JSON Schema 2020-12 when it names none or an unknown one
    (as jsonschema itself defaults)."""
    dialect = schema.get("$schema")
    if not isinstance(dialect, str):
        return referencing.jsonschema.DRAFT202012
    return referencing.jsonschema.specification_with(
        dialect, default=referencing.jsonschema.DRAFT202012
    )


def _nesting(value: Any) -> int:
    """How deeply objects and arrays nest in `value`, counted without recursion; stops counting
    one past MAX_SCHEMA_DEPTH."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (dict, list)):
            deepest = max(deepest, depth)
            if depth > MAX_SCHEMA_DEPTH:
                return depth
            items = value.values() if isinstance(value, dict) else value
            stack.extend((item, depth + 1) for item in items)
    return deepest


class _Refused(Exception):
    """What makes the schema unusable, worded for the report."""


class _Walk:
    """One pass over the subschemas reachable from the root. Subschemas reached by descending
    keywords go on a work list; in-place ones are followed depth-first with the chain that led
    to them, so a cycle among them shows as one."""

    def __init__(self, specification) -> None:
        self.specification = specification
        self.chain_below: dict[int, int] = {}  # id(subschema) -> longest in-place chain from it
        self.queued: set[int] = set()
        self.todo: list[tuple[dict, Any, str]] = []

    def run(self, schema: dict, resolver) -> None:
        """Raises _Refused naming the first problem."""
        self._queue(schema, resolver, "#")
        while self.todo:
            self._in_place(*self.todo.pop(), chain=[])

    def _queue(self, node: Any, resolver, where: str) -> None:
        if isinstance(node, dict) and id(node) not in self.queued:
            self.queued.add(id(node))
            self.todo.append((node, resolver, where))

    def _in_place(self, node: Any, resolver, where: str, chain: list[int]) -> None:
        """Follow the in-place subschemas of `node`, then queue the ones that descend. The
        recursion is at most MAX_IN_PLACE_CHAIN deep: `chain` is the in-place path here."""
        if not isinstance(node, dict) or id(node) in self.chain_below:
            return
        if id(node) in chain:
            raise _Refused(f"a $ref loop at {where} applies the schema to the same value forever")
        if len(chain) >= MAX_IN_PLACE_CHAIN:
            raise _Refused(f"more than {MAX_IN_PLACE_CHAIN} $ref / allOf-like hops in a row (at {where})")
        resolver = resolver.in_subresource(
            Resource.from_contents(node, default_specification=self.specification)
        )
        longest = 0
        for child, child_resolver, child_where in self._children(node, resolver, where):
            self._in_place(child, child_resolver, child_where, [*chain, id(node)])
            longest = max(longest, 1 + self.chain_below.get(id(child), 0))
        if len(chain) + longest > MAX_IN_PLACE_CHAIN:
            raise _Refused(f"more than {MAX_IN_PLACE_CHAIN} $ref / allOf-like hops in a row (at {where})")
        self.chain_below[id(node)] = longest
        self._descend(node, resolver, where)

    def _children(self, node: dict, resolver, where: str):
        """The in-place subschemas of `node`, each with its resolver and location."""
        for keyword in _REF_KEYWORDS:
            if keyword in node:
                resolved = _lookup(resolver, keyword, node[keyword], where)
                yield resolved.contents, resolved.resolver, _shown(node[keyword])
        for keyword in _IN_PLACE_ONE:
            yield node.get(keyword), resolver, f"{where}/{keyword}"
        for keyword in _IN_PLACE_LIST:
            if isinstance(node.get(keyword), list):
                for i, child in enumerate(node[keyword]):
                    yield child, resolver, f"{where}/{keyword}/{i}"
        for keyword in _IN_PLACE_MAP:
            if isinstance(node.get(keyword), dict):
                for name, child in node[keyword].items():
                    yield child, resolver, f"{where}/{keyword}/{name}"

    def _descend(self, node: dict, resolver, where: str) -> None:
        for keyword in _DESCENDING_ONE:
            self._queue(node.get(keyword), resolver, f"{where}/{keyword}")
        for keyword in _DESCENDING_LIST:
            if isinstance(node.get(keyword), list):
                for i, child in enumerate(node[keyword]):
                    self._queue(child, resolver, f"{where}/{keyword}/{i}")
        for keyword in _DESCENDING_MAP:
            if isinstance(node.get(keyword), dict):
                for name, child in node[keyword].items():
                    self._queue(child, resolver, f"{where}/{keyword}/{name}")


def _lookup(resolver, keyword: str, ref: Any, where: str):
    """`ref` resolved inside the schema; raises _Refused naming it."""
    if not isinstance(ref, str):
        raise _Refused(f"{keyword} at {where} is not a string")
    try:
        return resolver.lookup(ref)
    except Unresolvable:
        raise _Refused(f"{keyword} {_shown(ref)} at {where} does not resolve inside the schema "
                       "(references are never fetched)") from None
    except Exception as exc:  # noqa: BLE001 - a malformed pointer or address
        raise _Refused(f"{keyword} {_shown(ref)} at {where} cannot be read: {exc}") from None


def _shown(text: str, chars: int = 80) -> str:
    return repr(text if len(text) <= chars else text[:chars] + "…")
