"""Check and repair the arguments a model wrote for a tool, before anything reaches a server.

- Reserved arguments (`episode_id`) are removed from the schema the model sees and from whatever
  the model passes; the manager fills `episode_id` itself.
- Small, unambiguous repairs: known aliases (`python_code` -> `code`), camelCase / dashes /
  capitals (`Expression` -> `expression`), a lone unknown key for a one-parameter tool, a plain
  string (or a JSON object in a string) for a tool with one required parameter.
- Then JSON-schema validation, with an error text that a model can act on: what is wrong and
  which arguments the tool expects.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import jsonschema

from tools.schema import type_name

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
_JSON_SCALARS = frozenset({str, int, float, bool, type(None)})


class ArgumentError(ValueError):
    """Arguments that cannot be repaired; the message is written for the model."""


def _snake(name: str) -> str:
    name = re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name.strip())
    return name.replace("-", "_").replace(" ", "_").lower()


def public_schema(input_schema: dict) -> tuple[dict, bool]:
    """(the schema without reserved arguments, whether the tool takes `episode_id`)."""
    schema = copy.deepcopy(input_schema) if input_schema else {"type": "object", "properties": {}}
    properties = schema.get("properties") or {}
    takes_episode_id = "episode_id" in properties
    for name in RESERVED_ARGS:
        properties.pop(name, None)
    if "required" in schema:
        schema["required"] = [r for r in schema["required"] if r not in RESERVED_ARGS]
    return schema, takes_episode_id


class ToolArguments:
    """Arguments of one tool: `prepare` turns what the model wrote into what the server gets."""

    def __init__(self, tool_name: str, input_schema: dict):
        self.tool_name = tool_name
        self.schema, self.takes_episode_id = public_schema(input_schema)
        self.properties: dict[str, dict] = self.schema.get("properties") or {}
        self.required: list[str] = list(self.schema.get("required") or [])
        validator_class = jsonschema.validators.validator_for(
            self.schema, default=jsonschema.Draft202012Validator
        )
        try:
            validator_class.check_schema(self.schema)
            self._validator = validator_class(self.schema)
        except jsonschema.SchemaError:
            self._validator = None  # a server's broken schema: let the server judge its arguments
        self._fast_checks = self._simple_checks()
        self.signature = (
            "{"
            + ", ".join(
                f'"{name}": {type_name(prop)}' + (" (required)" if name in self.required else "")
                for name, prop in self.properties.items()
            )
            + "}"
        )

    def prepare(self, arguments: Any, episode_id: str | None = None) -> dict:
        """Repaired, validated arguments with `episode_id` filled in; raises ArgumentError."""
        args = self._as_dict(arguments)
        for name in RESERVED_ARGS:
            args.pop(name, None)  # a model never chooses its own episode
        if self.properties:
            args = self._rename(args)
        slow_check = not self._fast_valid(args) and self._validator is not None
        if slow_check and not self._validator.is_valid(args):
            raise ArgumentError(self._explain(args))
        try:
            if not all(type(v) in _JSON_SCALARS for v in args.values()):
                json.dumps(args)
        except (TypeError, ValueError) as exc:  # would fail in the SDK and look like a dead server
            raise ArgumentError(
                f"arguments for {self.tool_name} must be JSON values: {exc}"
            ) from None
        if self.takes_episode_id and episode_id is not None:
            args["episode_id"] = episode_id
        return args

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
