"""Check and repair the arguments a model wrote for a tool, before anything reaches a server.

- Reserved arguments (`episode_id`) are removed from the schema the model sees and from whatever
  the model passes; the manager fills `episode_id` itself.
- Small, unambiguous repairs: known aliases (`python_code` -> `code`), camelCase / dashes /
  capitals (`Expression` -> `expression`), a lone unknown key for a one-parameter tool, a plain
  string (or a JSON object in a string) for a tool with one required parameter.
- Then JSON-schema validation, with an error text that a model can act on: what is wrong and
  which arguments the tool expects.

Arguments that cannot be sent exactly as JSON (a lone surrogate in a string, NaN, a set, a
non-string key, absurd nesting) are refused first, naming where they are: the SDK would fail to
encode the request, or silently send something else (NaN as null), and either is the caller's
error, never the server's.
"""

from __future__ import annotations

import copy
import json
import math
import re
from typing import Any

import jsonschema

from tools.schema import type_name
from tools.schema_refs import local_registry, schema_problem

RESERVED_ARGS = ("episode_id",)
"""Arguments the manager fills in; a tool declares one by having a property of that name."""

ALIASES = {
    "python_code": "code",
    "source_code": "code",
    "source": "code",
    "script": "code",
    "program": "code",
    "python": "code",
    "expr": "expression",
    "formula": "expression",
    "math": "expression",
    "equation": "expression",
    "q": "query",
    "search_query": "query",
    "search": "query",
}
"""Names models often use instead of the declared one; applied only when the target exists."""

MAX_ERRORS_SHOWN = 4

# A fast path for the common flat schema (primitive-typed properties): the hot path skips
# jsonschema when these checks pass; anything else, and every failure, goes to jsonschema.
_PRIMITIVE_CHECKS = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: (
        (isinstance(v, int) and not isinstance(v, bool))
        or (isinstance(v, float) and v.is_integer())
    ),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    None: lambda v: True,  # no type: any JSON value
}
_ANNOTATIONS = {"title", "description", "default", "examples"}

MAX_JSON_DEPTH = 100
"""Deepest nesting of arguments sent (the SDK's encoder gives up near 250 levels, and parsers on
the server side often sooner)."""
MAX_INT_DIGITS = 4300
"""Longest integer sent: Python's default limit for int <-> str, so a Python server could not
read a longer one."""
_INT_BOUND = 10**MAX_INT_DIGITS
_SURROGATE = re.compile("[\ud800-\udfff]")


class ArgumentError(ValueError):
    """Arguments that cannot be repaired; the message is written for the model."""


def _snake(name: str) -> str:
    name = re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name.strip())
    return name.replace("-", "_").replace(" ", "_").lower()


def public_schema(input_schema: dict) -> tuple[dict, bool]:
    """(the schema without reserved arguments, whether the tool takes `episode_id`)."""
    schema = copy.deepcopy(input_schema) if input_schema else {"type": "object", "properties": {}}
    properties = schema.get("properties")
    if not isinstance(properties, dict):
        return schema, False
    takes_episode_id = "episode_id" in properties
    for name in RESERVED_ARGS:
        properties.pop(name, None)
    if isinstance(schema.get("required"), list):
        schema["required"] = [r for r in schema["required"] if r not in RESERVED_ARGS]
    return schema, takes_episode_id


class ToolArguments:
    """Arguments of one tool: `prepare` turns what the model wrote into what the server gets."""

    def __init__(self, tool_name: str, input_schema: dict):
        self.tool_name = tool_name
        self.schema, self.takes_episode_id = public_schema(input_schema)
        properties, required = self.schema.get("properties"), self.schema.get("required")
        # A hostile schema's `properties` may be any JSON: only an object of them is read.
        self.properties: dict[str, dict] = properties if isinstance(properties, dict) else {}
        self.required: list[str] = [r for r in required if isinstance(r, str)] if isinstance(required, list) else []
        self.schema_problem = schema_problem(self.schema)
        """Why this tool's arguments go to its server unchecked (None: they are checked here)."""
        self._validator = None if self.schema_problem else self._make_validator()
        self._fast_checks = self._simple_checks()
        self.signature = (
            "{"
            + ", ".join(
                f'"{name}": {type_name(prop)}' + (" (required)" if name in self.required else "")
                for name, prop in self.properties.items()
            )
            + "}"
        )

    def _make_validator(self):
        """The schema's validator, with references resolved only inside it; None (and
        `schema_problem` set) when jsonschema rejects the schema."""
        validator_class = jsonschema.validators.validator_for(
            self.schema, default=jsonschema.Draft202012Validator
        )
        try:
            validator_class.check_schema(self.schema)
            return validator_class(self.schema, registry=local_registry(self.schema))
        except jsonschema.SchemaError as exc:
            self.schema_problem = f"not a valid JSON schema: {exc.message}"
        except Exception as exc:  # noqa: BLE001 - whatever else a hostile schema trips (RecursionError, ...)
            self.schema_problem = f"the schema cannot be used: {type(exc).__name__}: {exc}"
        return None

    def prepare(self, arguments: Any, episode_id: str | None = None) -> dict:
        """Repaired, validated arguments with `episode_id` filled in; raises ArgumentError."""
        args = self._as_dict(arguments)
        for name in RESERVED_ARGS:
            args.pop(name, None)  # a model never chooses its own episode
        problem = json_problem(args)
        if problem:
            raise ArgumentError(
                f"invalid arguments for {self.tool_name}: {problem}. "
                f"Expected arguments: {self.signature}"
            )
        if self.properties:
            args = self._rename(args)
        if not self._fast_valid(args) and self._validator is not None:
            self._validate(args)
        if self.takes_episode_id and episode_id is not None:
            args["episode_id"] = episode_id
        return args

    def _validate(self, args: dict) -> None:
        """Raises ArgumentError when `args` do not fit the schema, or cannot be checked against
        it: arguments nested deeply through a recursive schema can exhaust Python's stack, and
        a failure inside jsonschema must not escape `call_tool`."""
        try:
            if self._validator.is_valid(args):
                return
            message = self._explain(args)
        except RecursionError:
            message = (f"invalid arguments for {self.tool_name}: nested too deeply to check against "
                       f"the tool's schema. Expected arguments: {self.signature}")
        except Exception as exc:  # noqa: BLE001 - a failure inside jsonschema is the schema's, not the caller's
            message = (f"invalid arguments for {self.tool_name}: they could not be checked against "
                       f"the tool's schema ({type(exc).__name__}: {exc}). "
                       f"Expected arguments: {self.signature}")
        raise ArgumentError(message)

    def _simple_checks(self) -> dict[str, Any] | None:
        """Per-property type checks when the schema is flat and primitive, else None."""
        if set(self.schema) - _ANNOTATIONS - {"type", "properties", "required"}:
            return None
        if self.schema.get("type", "object") != "object":
            return None
        checks = {}
        for name, prop in self.properties.items():
            if not isinstance(prop, dict) or set(prop) - _ANNOTATIONS - {"type"}:
                return None
            if prop.get("type") not in _PRIMITIVE_CHECKS:
                return None
            checks[name] = _PRIMITIVE_CHECKS[prop.get("type")]
        return checks

    def _fast_valid(self, args: dict) -> bool:
        checks = self._fast_checks
        if checks is None:
            return False
        if any(name not in args for name in self.required):
            return False
        return all(check(args[name]) for name, check in checks.items() if name in args)

    def _as_dict(self, arguments: Any) -> dict:
        if arguments is None:
            return {}
        if isinstance(arguments, dict):
            return dict(arguments)
        if isinstance(arguments, str):
            text = arguments.strip()
            if text.startswith("{"):
                try:
                    parsed = json.loads(text)
                except ValueError:
                    parsed = None
                if isinstance(parsed, dict):
                    return parsed
            single = self.required if len(self.required) == 1 else list(self.properties)
            if len(single) == 1:
                return {single[0]: arguments}
        raise ArgumentError(
            f"arguments for {self.tool_name} must be a JSON object like {self.signature}, "
            f"got {type(arguments).__name__}"
        )

    def _rename(self, args: dict) -> dict:
        unknown = [k for k in args if k not in self.properties]
        for key in unknown:
            for candidate in (ALIASES.get(key), _snake(key), ALIASES.get(_snake(key))):
                if candidate in self.properties and candidate not in args:
                    args[candidate] = args.pop(key)
                    break
        if len(self.properties) == 1 and len(args) == 1:
            (key,) = args
            (only,) = self.properties
            if key != only:
                args = {only: args[key]}
        return args

    def _explain(self, args: dict) -> str:
        errors = sorted(
            self._validator.iter_errors(args), key=lambda e: list(map(str, e.absolute_path))
        )
        lines = []
        for error in errors[:MAX_ERRORS_SHOWN]:
            path = ".".join(str(p) for p in error.absolute_path)
            lines.append(f"{path}: {error.message}" if path else error.message)
        if len(errors) > MAX_ERRORS_SHOWN:
            lines.append(f"(and {len(errors) - MAX_ERRORS_SHOWN} more)")
        return f"invalid arguments for {self.tool_name}: {'; '.join(lines)}. Expected arguments: {self.signature}"


def json_problem(value: Any) -> str | None:
    """Why `value` cannot be sent as exactly this JSON, prefixed by where (`items.2.name: ...`);
    None when it can. Walks without recursion, so no nesting can overflow the stack."""
    stack: list[tuple[Any, tuple]] = [(value, ())]
    while stack:
        value, path = stack.pop()
        problem = None
        if isinstance(value, str):
            if not value.isascii():
                problem = _text_problem(value, "string")
        elif value is None or isinstance(value, bool):
            continue
        elif isinstance(value, int):
            if not -_INT_BOUND < value < _INT_BOUND:
                problem = f"an integer longer than {MAX_INT_DIGITS} digits cannot be sent"
        elif isinstance(value, float):
            if not math.isfinite(value):
                problem = f"{json.dumps(value)} is not a JSON number (only finite numbers are)"
        elif isinstance(value, (dict, list, tuple)):
            if len(path) >= MAX_JSON_DEPTH:
                problem = f"nested deeper than {MAX_JSON_DEPTH} levels"
            elif isinstance(value, dict):
                problem = _keys_problem(value)
                # Reversed: the first problem in reading order is the one reported.
                stack.extend((item, (*path, key)) for key, item in reversed(value.items()))
            else:
                stack.extend((item, (*path, i)) for i, item in reversed(list(enumerate(value))))
        else:
            problem = (
                f"a value of type {type(value).__name__} is not JSON "
                "(JSON has strings, numbers, booleans, null, arrays and objects)"
            )
        if problem:
            return f"{_where(path)}: {problem}" if path else problem
    return None


def _where(path: tuple, parts: int = 8, chars: int = 40) -> str:
    """A dotted path, bounded: a cycle or a huge key must not make a huge message."""
    shown = [str(p) if len(str(p)) <= chars else str(p)[:chars] + "…" for p in path[:parts]]
    return ".".join(shown) + (f"…(+{len(path) - parts} levels)" if len(path) > parts else "")


def _keys_problem(value: dict) -> str | None:
    for key in value:
        if not isinstance(key, str):
            return f"key {key!r} is not a string (JSON keys are strings)"
        if not key.isascii():
            problem = _text_problem(key, "key")
            if problem:
                return problem
    return None


def _text_problem(text: str, what: str) -> str | None:
    surrogate = _SURROGATE.search(text)
    if surrogate is None:
        return None
    return (
        f"the {what} has a lone surrogate {ascii(surrogate.group())[1:-1]} at character "
        f"{surrogate.start()}, which is not Unicode text and cannot be sent"
    )
